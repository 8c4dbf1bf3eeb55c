// Op details: one op of one run, or an aligned op of two runs side by side,
// from the daemon's full records (trace endpoint) and the source files the
// runs sent (/api/source). Values that differ between the sides are marked.
import { api, decodeScalar, el, shapeText, siteText } from './util.js';

const SOURCE_CONTEXT = 6;  // lines shown either side of the op's line

async function record(side) {
  const page = await api(`runs/${encodeURIComponent(side.run)}/ranks/${side.rank}/trace`,
    { lane: side.lane, from: side.op_index, count: 1 });
  const op = page.ops[0];
  if (!op || op.op_index !== side.op_index) throw new Error(`op #${side.op_index} is not stored`);
  return op;
}

const statText = (s) => (s ? `min ${s.min} · max ${s.max} · sum ${s.sum} · l2 ${s.l2}` +
  (s.nan_count || s.inf_count ? ` · nan ${s.nan_count} · inf ${s.inf_count}` : '') : 'no statistics');

function statDiff(a, b) {
  if (!a || !b) return '';
  const d = ['min', 'max', 'sum', 'l2'].filter((k) => a[k] !== b[k]).map((k) => `Δ${k} ${(b[k] - a[k]).toPrecision(4)}`);
  if (a.nan_count !== b.nan_count) d.push(`nan ${a.nan_count} → ${b.nan_count}`);
  if (a.inf_count !== b.inf_count) d.push(`inf ${a.inf_count} → ${b.inf_count}`);
  return d.join(' · ');
}

// A trusted op (OPGUARD_TRUSTED) was recorded without fingerprints: its
// tensors have a dtype and shape only, and nothing about it is compared.
const NOT_FINGERPRINTED = 'not fingerprinted (trusted op)';

function tensorCell(t, other, trusted) {
  if (!t) return el('td', { class: 'muted' }, '—');
  if (trusted.self) return el('td', { class: 'muted' }, el('div', {}, shapeText(t)), el('div', { class: 'small' }, NOT_FINGERPRINTED));
  const differs = other && !trusted.other && other.fingerprint !== t.fingerprint;
  return el('td', { class: differs ? 'differs' : '' },
    el('div', {}, shapeText(t)), el('div', { class: 'mono' }, t.fingerprint), el('div', { class: 'small' }, statText(t.stats)));
}

function inputText(v, trusted) {
  switch (v.kind) {
    case 'scalar': return `${v.dtype.toLowerCase()} ${decodeScalar(v.bits_hex, v.dtype)}  (bits 0x${v.bits_hex})`;
    case 'tensor': return `${shapeText(v.tensor)} ${trusted ? NOT_FINGERPRINTED : v.tensor.fingerprint}`;
    case 'tensor_list': return `list of ${v.tensors.length}: ` +
      (trusted ? NOT_FINGERPRINTED : v.tensors.map((t) => t.fingerprint.slice(0, 8)).join(' '));
    default: return 'none';
  }
}

async function sourceBlock(side, op) {
  const site = op.site;
  if (!site || !site.file) return el('p', { class: 'muted' }, 'no call site recorded');
  try {
    const { text } = await api('source', { run: side.run, file: site.file });
    const lines = text.split('\n');
    const first = Math.max(1, site.line - SOURCE_CONTEXT), last = Math.min(lines.length, site.line + SOURCE_CONTEXT);
    const rows = [];
    for (let n = first; n <= last; ++n) {
      rows.push(el('div', { class: n === site.line ? 'line hl' : 'line', 'data-line': n },
        el('span', { class: 'ln' }, n), lines[n - 1]));
    }
    return el('div', { class: 'source' }, el('div', { class: 'small muted' }, `${site.file} (as run by ${side.run})`), rows);
  } catch (e) {
    return el('p', { class: 'muted' }, e.message);
  }
}

// Renders into `panel`; sides: [{label, run, rank, lane, op_index} | null, ...].
export async function showDetails(panel, sides) {
  panel.replaceChildren(el('p', { class: 'muted' }, 'Loading op…'));
  const present = sides.filter(Boolean);
  const ops = await Promise.all(present.map((s) => record(s).catch((e) => ({ error: e.message }))));
  const bad = ops.find((o) => o.error);
  if (bad) {
    panel.replaceChildren(el('p', { class: 'error' }, bad.error));
    return;
  }
  const [a, b] = ops;
  const head = el('tr', {}, el('th', {}), present.map((s) => el('th', {}, `${s.label}: ${s.run}`)));
  const row = (name, f, cls = () => '') => el('tr', {}, el('th', {}, name), ops.map((o, i) => el('td', { class: cls(o, ops[1 - i]) }, f(o))));
  const differs = (f) => (o, other) => (other && f(o) !== f(other) ? 'differs' : '');
  const compared = !ops.some((o) => o.trusted);
  const outputs = [];
  const nOut = Math.max(...ops.map((o) => o.outputs.length));
  for (let i = 0; i < nOut; ++i) {
    outputs.push(el('tr', {}, el('th', {}, `output ${i}`), ops.map((o, k) => tensorCell(o.outputs[i], ops[1 - k]?.outputs[i],
      { self: o.trusted, other: ops[1 - k]?.trusted }))));
    if (b && compared && a.outputs[i] && b.outputs[i] && a.outputs[i].fingerprint !== b.outputs[i].fingerprint) {
      outputs.push(el('tr', { class: 'delta' }, el('th', {}, 'difference'),
        el('td', { colspan: 2 }, statDiff(a.outputs[i].stats, b.outputs[i].stats) || 'same statistics, different bits')));
    }
  }
  const inputs = [];
  const nIn = Math.max(...ops.map((o) => o.inputs.length));
  for (let i = 0; i < nIn; ++i) {
    inputs.push(row(`input ${i}`, (o) => (o.inputs[i] ? inputText(o.inputs[i], o.trusted) : '—'),
      compared ? differs((o) => (o.inputs[i] ? inputText(o.inputs[i]) : '')) : () => ''));
  }
  const table = el('table', { class: 'details' }, el('thead', {}, head), el('tbody', {},
    row('op', (o) => o.name, differs((o) => o.name)),
    row('op index · step', (o) => `#${o.op_index} · step ${o.step}${o.backward ? ' · backward' : ''}`),
    // The recorded frames: the op's call site and, for a backward op with
    // its own site, the forward that created its autograd node.
    row('call stack', (o) => [siteText(o.site) || 'unknown', o.forward_site && `↳ forward at ${siteText(o.forward_site)}`]
      .filter(Boolean).map((f) => el('div', {}, f)), differs((o) => siteText(o.site))),
    outputs, inputs,
    row('kernels', (o) => o.kernels.join(', ') || 'none recorded', differs((o) => o.kernels.join())),
    row('element diff', () => 'not captured for this op'),
    row('duration', (o) => `${(o.duration_ns / 1000).toFixed(1)} µs`)));
  const sources = await Promise.all(present.map((s, i) => sourceBlock(s, ops[i])));
  panel.replaceChildren(el('h3', {}, ops[0].name, b && a.name !== b.name ? ` / ${b.name}` : ''), table,
    el('div', { class: 'sources' }, sources));
}

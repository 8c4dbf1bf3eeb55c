// "/diff?reference=REF&suspect=SUS[&rank=R][&lane=L][&op=N]": the two-run diff. The
// verdict and its pivot, a ranks × steps overview of where each rank
// diverged and how it reached the others, then one rank's lane as two
// aligned lanes (virtualised, paged from /api/alignment), with the first
// divergent op highlighted and scrolled into view. `op` is a suspect op index.
import { api, el, navigate, setTitle, siteText } from './util.js';
import { VirtualList } from './virtual.js';
import { showDetails } from './details.js';

const MAX_STEP_COLUMNS = 120;
// How a row's two ops relate: aligned with equal outputs, aligned with
// differing ones, aligned but never compared (a trusted op, recorded without
// fingerprints), or unaligned.
const LINK_MARKS = { equal: '═', differs: '≠', trusted: '○', unaligned: '·' };

function opCell(op, cls) {
  if (!op) return el('span', { class: `op ${cls} missing` }, 'no partner');
  return el('span', { class: `op ${cls}`, title: siteText(op.site) },
    el('b', {}, `#${op.op_index}`), ` ${op.name ?? '?'} `, el('span', { class: 'muted' }, `${siteText(op.site)} · step ${op.step}`));
}

function summary(report) {
  const fd = report.first_divergence;
  const items = [el('span', { class: `badge ${report.status}`, id: 'status' }, report.status)];
  if (fd) {
    items.push(el('a', { id: 'pivot-summary', href: '#', 'data-rank': fd.rank, 'data-op': fd.op_index.suspect },
      `first divergence · rank ${fd.rank} · step ${fd.step} · ${fd.op}  (${siteText(fd.site.suspect)})`));
  } else {
    items.push(el('span', {}, report.status === 'identical' ? 'the runs agree bit for bit' : 'no pivot'));
  }
  const lines = [el('p', { class: 'verdict' }, items)];
  if (fd) {
    lines.push(el('p', {}, `aligned ${report.aligned.toLocaleString('en')} ops · unaligned before the pivot: ` +
      `reference ${report.unaligned_before.reference}, suspect ${report.unaligned_before.suspect}`));
    const p = fd.producer;
    lines.push(el('p', { id: 'evidence' }, fd.code_changed
      ? `the code here differs between the runs (reference ${siteText(fd.site.reference)}, ` +
        `suspect ${siteText(fd.site.suspect)}), output differs → the edit`
      : fd.inputs_equal
      ? 'inputs identical, output differs → the op itself (kernel race, SDC, wrong code)'
      : p ? `inputs differ → an input comes from #${p.op.op_index} ${p.op.op} (${siteText(p.op.site)}) of the ${p.run} run, ` +
            `which has no partner in the ${p.run === 'suspect' ? 'reference' : 'suspect'}`
        : 'inputs differ → a producer upstream that was not recorded (or not aligned) changed them'));
  }
  if (report.diagnosis) {
    const d = report.diagnosis;
    lines.push(el('p', { id: 'diagnosis' }, `diagnosis (${d.cause}): ${d.text}` + (d.spread ? ` ${d.spread}` : '')));
  }
  for (const note of report.notes) lines.push(el('p', { class: 'small muted' }, note));
  return el('section', { class: 'summary', id: 'summary' }, lines);
}

// Ranks × steps: where each rank first diverged, and which collective carried
// divergence to the ranks that did not start it.
function overview(report, suspectRun, names, onRank) {
  const steps = Math.max(1, ...suspectRun.ranks.map((r) => r.steps));
  const bucket = Math.ceil(steps / MAX_STEP_COLUMNS);
  const origin = new Set(report.diverging_ranks);
  const via = new Map(report.explained.map((e) => [e.rank, e]));
  const rows = report.ranks.map((rd) => {
    const fd = rd.first_divergence || rd.first_observed;
    const cells = [];
    for (let s = 0; s < steps; s += bucket) {
      let state = 'ok';
      if (fd && fd.step < s) state = 'after';
      if (fd && fd.step >= s && fd.step < s + bucket) state = rd.first_observed ? 'incomplete' : origin.has(rd.rank) ? 'origin' : 'carried';
      cells.push(el('td', { class: `cell ${state}`, title: `rank ${rd.rank} · step ${s}${bucket > 1 ? '–' + (s + bucket - 1) : ''} · ${state}` }));
    }
    const e = via.get(rd.rank);
    const why = origin.has(rd.rank) ? `diverged first (step ${fd.step}, op #${fd.suspect.op_index})`
      : e ? `reached from rank ${e.from_rank} via ${names.get(e.communicator) ?? e.communicator} #${e.seq}`
        : rd.status;
    return el('tr', { 'data-rank': rd.rank },
      el('th', {}, el('a', { href: '#', onclick: (ev) => { ev.preventDefault(); onRank(rd.rank); } }, `rank ${rd.rank}`)),
      cells, el('td', { class: 'why' }, why));
  });
  for (const r of report.missing_ranks) rows.push(el('tr', {}, el('th', {}, `rank ${r}`), el('td', { class: 'why' }, 'no answer (partial)')));
  return el('section', {}, el('h3', {}, 'Cluster: ranks × steps'),
    el('table', { class: 'overview', id: 'overview' }, el('tbody', {}, rows)),
    el('p', { class: 'legend small' }, el('span', { class: 'cell origin' }), ' diverged first ',
      el('span', { class: 'cell carried' }), ' reached through a collective ', el('span', { class: 'cell after' }), ' after'));
}

export async function diffView(main, params, alive) {
  const reference = params.get('reference'), suspect = params.get('suspect');
  if (!reference || !suspect) throw new Error('a diff needs /diff?reference=RUN&suspect=RUN');
  setTitle(`${reference} ↔ ${suspect}`);
  main.append(el('p', { class: 'muted' }, 'Aligning…'));
  const enc = encodeURIComponent;
  const [report, suspectRun, collectives] = await Promise.all([
    api('diff', { reference, suspect }), api(`runs/${enc(suspect)}`),
    api(`runs/${enc(suspect)}/collectives`).catch(() => ({ live: [] }))]);
  if (!alive()) return;
  const names = new Map(collectives.live.map((c) => [c.communicator, c.name]));
  const lanes = el('section', { id: 'lanes' });
  const panel = el('section', { class: 'panel', id: 'details' }, el('p', { class: 'muted' }, 'Click an op for its details.'));

  async function showRank(rank, op, laneParam) {
    const url = new URLSearchParams({ reference, suspect, rank });
    if (laneParam !== undefined) url.set('lane', laneParam);
    if (op !== undefined) url.set('op', op);
    navigate(`/diff?${url}`, true);
    const rd = report.ranks.find((r) => r.rank === rank);
    if (!rd) {
      lanes.replaceChildren(el('p', { class: 'error' }, `no rank ${rank} in this diff`));
      return;
    }
    const pivot = rd.first_divergence || rd.first_observed;
    const lane = laneParam ?? (pivot ? pivot.lane : rd.lanes[0]?.lane ?? 0);
    const base = { reference, suspect, rank, lane };
    const onPivotLane = pivot && pivot.lane === lane;
    const first = await api('alignment', { ...base, from: 0, count: 1, op: onPivotLane ? pivot.op_index.suspect : undefined });
    const pivotRow = onPivotLane ? first.located : null;
    let selected = pivotRow;
    if (op !== undefined && !(onPivotLane && op === pivot.op_index.suspect)) {
      selected = (await api('alignment', { ...base, from: 0, count: 1, op })).located;
    }
    const list = new VirtualList({
      total: first.rows_total, height: 420, className: 'alignment',
      fetchPage: async (from, count) => (await api('alignment', { ...base, from, count })).rows,
      renderRow: (row, i) => el('div', { class: `arow ${row.link}${i === pivotRow ? ' pivot' : ''}`, 'data-row': i, title: row.flags.join(' ') },
        opCell(row.reference, 'ref'), el('span', { class: 'link' }, LINK_MARKS[row.link] ?? '·'), opCell(row.suspect, 'sus')),
    });
    const open = async (i) => {
      const rows = await list.page(Math.floor(i / 200));
      const row = rows?.[i % 200];
      if (!row) return;
      list.select(i);
      const at = new URLSearchParams({ reference, suspect, rank });
      if (laneParam !== undefined) at.set('lane', lane);
      if (row.suspect) at.set('op', row.suspect.op_index);
      navigate(`/diff?${at}`, true);
      await showDetails(panel, [
        row.reference && { label: 'reference', run: reference, rank, lane, op_index: row.reference.op_index },
        row.suspect && { label: 'suspect', run: suspect, rank, lane, op_index: row.suspect.op_index }]);
    };
    list.element.addEventListener('click', (e) => {
      const node = e.target.closest('.vrow');
      if (node) open(Number(node.dataset.index));
    });
    // Lanes (main thread, autograd thread, ...) align separately.
    const laneChoice = first.lanes.length < 2 ? '' : el('select', { id: 'lane', onchange: (e) => showRank(rank, undefined, Number(e.target.value)) },
      first.lanes.map((l) => el('option', { value: l, selected: l === lane }, `lane ${l}`)));
    lanes.replaceChildren(el('h3', { id: 'rank-title' }, `Rank ${rank}: ${rd.status} `, laneChoice),
      el('p', { class: 'small muted' }, `${first.rows_total.toLocaleString('en')} rows · ${first.pairs.toLocaleString('en')} aligned pairs · ` +
        `ops: reference ${first.ops.reference.toLocaleString('en')}, suspect ${first.ops.suspect.toLocaleString('en')}`),
      el('div', { class: 'lane-heads' }, el('span', {}, `reference: ${reference}`), el('span', {}, `suspect: ${suspect}`)),
      list.element);
    if (selected !== null && selected !== undefined) {
      list.scrollToIndex(selected);
      if (op !== undefined) await open(selected);
    } else {
      list.draw();
    }
  }

  main.replaceChildren(summary(report), overview(report, suspectRun, names, (r) => showRank(r)), lanes, panel);
  const pivotLink = main.querySelector('#pivot-summary');
  if (pivotLink) pivotLink.addEventListener('click', (e) => { e.preventDefault(); showRank(report.first_divergence.rank); });
  const rankParam = params.get('rank');
  const start = rankParam !== null ? Number(rankParam) : report.first_divergence?.rank ?? report.ranks[0]?.rank;
  const number = (key) => (params.get(key) !== null ? Number(params.get(key)) : undefined);
  if (start !== undefined) await showRank(start, number('op'), number('lane'));
}

// "/run?name=RUN[&rank=R][&op=I][&replicas=R,R,...]": one run. Its ranks and
// settings, the rank × collective matrix (desyncs, mismatches, hung
// collectives marked), the replica check of the ranks named (run at once for
// `replicas` and for a run recorded in online SDC mode), and one rank's ops as
// a virtualised list paged from the trace endpoint, op I selected.
import { api, el, navigate, setTitle, short, siteText } from './util.js';
import { VirtualList } from './virtual.js';
import { showDetails } from './details.js';

const MAX_SEQ_COLUMNS = 400;
// Kinds get a colour of their own in the matrix's first row.
const KINDS = ['all_reduce', 'all_gather', 'reduce_scatter', 'broadcast', 'reduce', 'all_to_all', 'send', 'recv',
  'barrier', 'gather', 'scatter'];

// seq -> kind of one communicator, from the report's runs of equal kinds.
function kindAt(runs) {
  return (seq) => runs.find((k) => k.from_seq <= seq && seq <= k.to_seq)?.kind ?? '';
}

// Cell state of (rank, seq) on one communicator, from the collectives report.
function matrix(report) {
  const sections = [];
  const marks = new Map();  // `${comm}/${seq}/${rank}` -> [state, title]
  for (const d of report.desyncs) {
    for (const m of d.members) marks.set(`${d.communicator}/${d.seq}/${m.rank}`, ['desync', `desync (${d.fields.join(', ')}): ${m.kind} root ${m.root} count ${m.count} · ${siteText(m.site)}`]);
  }
  for (const x of report.mismatches) {
    for (const m of x.members) {
      const odd = x.minority_ranks.includes(m.rank);
      marks.set(`${x.communicator}/${x.seq}/${m.rank}`, [odd ? 'mismatch' : 'majority', `${x.kind} outputs ${odd ? 'differ from the majority' : 'agree with the majority'} · ${siteText(m.site)}`]);
    }
  }
  for (const comm of report.live) {
    const last = Math.max(-1, ...comm.ranks.map((r) => r.last_entered));
    const flagged = [...marks.keys()].filter((k) => k.startsWith(`${comm.communicator}/`)).map((k) => Number(k.split('/')[1]));
    const start = Math.max(0, Math.min(last - MAX_SEQ_COLUMNS + 1, ...flagged));
    const end = Math.min(last, start + MAX_SEQ_COLUMNS - 1);
    const kind = kindAt(comm.kinds ?? []);
    const kindCells = [];
    for (let seq = start; seq <= end; ++seq) {
      const k = kind(seq);
      kindCells.push(el('td', { class: `cell kind k${KINDS.indexOf(k)}`, 'data-seq': seq, 'data-kind': k, title: `#${seq} · ${k || 'no record'}` }));
    }
    const rows = [el('tr', { class: 'kinds' }, el('th', {}, 'kind'), kindCells), ...comm.ranks.map((r) => {
      const cells = [];
      for (let seq = start; seq <= end; ++seq) {
        let [state, title] = marks.get(`${comm.communicator}/${seq}/${r.rank}`) ?? [];
        if (!state) {
          state = seq <= r.last_completed ? 'done' : seq <= r.last_entered ? 'hung' : 'absent';
          title = state === 'done' ? 'completed' : state === 'hung' ? 'entered, never completed' : 'not joined';
        }
        cells.push(el('td', { class: `cell ${state}`, 'data-seq': seq, 'data-state': state, title: `rank ${r.rank} · #${seq} ${kind(seq)} · ${title}` }));
      }
      return el('tr', { 'data-rank': r.rank }, el('th', {}, `rank ${r.rank}`), cells);
    })];
    const seen = [...new Set((comm.kinds ?? []).map((k) => k.kind))];
    const pending = comm.pending_seq !== null
      ? `pending #${comm.pending_seq} ${comm.pending_kind}: waiting ${comm.waiting.join(', ') || '—'}, not joined ${comm.not_joined.join(', ') || '—'}` : 'all completed';
    sections.push(el('div', { class: 'comm' },
      el('h4', {}, `${comm.name || comm.communicator} · collectives #${start}–#${end}${start > 0 ? ` (of ${last + 1})` : ''} · ${pending}`),
      el('div', { class: 'scroll-x' }, el('table', { class: 'matrix', 'data-communicator': comm.name }, el('tbody', {}, rows))),
      el('p', { class: 'legend small' }, seen.flatMap((k) => [el('span', { class: `cell kind k${KINDS.indexOf(k)}` }), ` ${k} `]))));
  }
  return el('section', { id: 'collectives' },
    el('h3', {}, `Collectives: ${report.status === 'identical' ? 'consistent' : report.status}`,
      ` · ${report.desyncs.length} desync(s), ${report.mismatches.length} mismatch(es)${report.waiting ? ' · waiting' : ''}`),
    sections.length ? sections : el('p', { class: 'muted' }, 'no collectives recorded'),
    el('p', { class: 'legend small' }, ['done', 'desync', 'mismatch', 'hung', 'absent'].flatMap((s) => [el('span', { class: `cell ${s}` }), ` ${s} `])),
    report.notes.map((n) => el('p', { class: 'small muted' }, n)));
}

// The replica check (`opguard ranks --replicas`): each group's verdict and
// its first divergence, linked to that op in the rank's list.
function replicaGroups(name, report) {
  return report.replicas.map((g) => {
    const odd = g.odd_ranks.length ? ` · outside the majority: rank(s) ${g.odd_ranks.join(', ')}` : '';
    const f = g.first_divergence;
    const link = f && `/run?${new URLSearchParams({ name, rank: f.rank, op: f.op_index.suspect, replicas: g.ranks.join(',') })}`;
    return el('div', { class: 'replica-group', 'data-status': g.status },
      el('p', {}, el('span', { class: `badge ${g.status}` }, g.status),
        `replicas ${g.ranks.join(', ')} · ${g.compared_ops.toLocaleString('en')} replicated op(s) compared${odd}`),
      f && el('p', { class: 'replica-pivot' }, `first divergence · rank ${f.rank} · step ${f.step} · ${f.op} · ${siteText(f.site.suspect)} · `,
        el('a', { href: link }, `op #${f.op_index.suspect}`)),
      g.notes.map((n) => el('p', { class: 'small muted' }, n)));
  });
}

function replicasSection(name, run, params) {
  const result = el('div', { class: 'replica-result' });
  const asked = params.get('replicas');
  const input = el('input', { name: 'replicas', size: 24, value: asked ?? run.ranks.map((r) => r.rank).join(','),
    title: 'ranks that must hold identical bits (data-parallel replicas)' });
  const check = async (ranks) => {
    result.replaceChildren(el('p', { class: 'muted' }, 'Comparing replicas…'));
    try {
      const report = await api(`runs/${encodeURIComponent(name)}/ranks`, { replicas: ranks });
      result.replaceChildren(...(report.replicas.length ? replicaGroups(name, report)
        : [el('p', { class: 'muted' }, 'no node holds two of these ranks')]));
    } catch (e) {
      result.replaceChildren(el('p', { class: 'error' }, e.message));
    }
  };
  const form = el('form', {
    onsubmit: (e) => {
      e.preventDefault();
      const next = new URLSearchParams(location.search);
      next.set('replicas', input.value.trim());
      navigate(`/run?${next}`, true);
      check(input.value.trim());
    },
  }, el('label', {}, 'Replicas ', input), ' ', el('button', { type: 'submit' }, 'Compare'));
  if (asked !== null || run.environment?.OPGUARD_SDC === '1') check(input.value.trim());
  return el('section', { id: 'replicas' }, el('h3', {}, 'Replicas'), form, result);
}

async function opsList(section, name, rank, panel, laneIndex = 0, selectOp = null) {
  const enc = encodeURIComponent;
  const { lanes } = await api(`runs/${enc(name)}/ranks/${rank}/lanes`);
  const lane = lanes[laneIndex]?.lane ?? 0;
  const total = lanes.length ? lanes[laneIndex].last_op + 1 : 0;
  const list = new VirtualList({
    total, height: 420, className: 'ops',
    // Rows are op indices: an index the rank never recorded (a gap) shows so.
    fetchPage: async (from, count) => {
      const page = await api(`runs/${enc(name)}/ranks/${rank}/trace`, { lane, from, count });
      const rows = Array(count).fill(null);
      for (const op of page.ops) if (op.op_index - from < count) rows[op.op_index - from] = op;
      return rows;
    },
    renderRow: (op, i) => (op
      ? el('div', { class: 'orow' }, el('b', {}, `#${op.op_index}`), ` ${op.name} `,
        el('span', { class: 'muted' }, `${siteText(op.site)} · step ${op.step} · ${op.outputs.map((t) => short(t.fingerprint)).join(' ')}`))
      : el('div', { class: 'orow missing' }, `#${i} not recorded`)),
  });
  list.element.addEventListener('click', (e) => {
    const node = e.target.closest('.vrow');
    if (!node) return;
    list.select(Number(node.dataset.index));
    showDetails(panel, [{ label: name, run: name, rank, lane, op_index: Number(node.dataset.index) }]);
  });
  const choice = lanes.length < 2 ? `lane ${lane}` : el('select', { onchange: (e) => opsList(section, name, rank, panel, Number(e.target.value)) },
    lanes.map((l, i) => el('option', { value: i, selected: i === laneIndex }, `lane ${l.lane}`)));
  section.replaceChildren(el('h3', {}, `Rank ${rank} · `, choice, ` · ${total.toLocaleString('en')} ops`), list.element);
  list.draw();
  if (selectOp !== null && selectOp < total) {
    list.scrollToIndex(selectOp);
    list.select(selectOp);
    showDetails(panel, [{ label: name, run: name, rank, lane, op_index: selectOp }]);
  }
}

export async function runView(main, params, alive) {
  const name = params.get('name');
  if (!name) throw new Error('a run view needs /run?name=RUN');
  setTitle(name);
  const run = await api(`runs/${encodeURIComponent(name)}`);
  if (!alive()) return;
  const settings = Object.entries(run.determinism).map(([k, v]) => `${k}=${v}`).join(' · ') || 'none recorded';
  const rankTable = el('table', { class: 'runs' },
    el('thead', {}, el('tr', {}, ['rank', 'ops', 'steps', 'collectives', 'gaps', 'node', 'state'].map((h) => el('th', {}, h)))),
    el('tbody', {}, run.ranks.map((r) => el('tr', {},
      el('td', {}, el('a', { href: `/run?${new URLSearchParams({ name, rank: r.rank })}` }, r.rank)),
      el('td', { class: 'num' }, r.ops.toLocaleString('en')), el('td', { class: 'num' }, r.steps),
      el('td', { class: 'num' }, r.collectives), el('td', { class: 'num' + (r.gaps ? ' warn' : '') }, r.gaps),
      el('td', {}, r.node), el('td', {}, r.ended ? 'ended' : 'recording')))));
  const ops = el('section', { id: 'ops' });
  const panel = el('section', { class: 'panel', id: 'details' });
  const collectives = el('section', {}, el('p', { class: 'muted' }, 'Matching collectives…'));
  main.append(el('h2', {}, name), el('p', { class: 'small' }, `${run.framework} · world size ${run.world_size} · determinism: ${settings}`),
    rankTable, collectives, replicasSection(name, run, params), ops, panel);
  const rank = Number(params.get('rank') ?? run.ranks[0]?.rank ?? 0);
  const op = params.has('op') ? Number(params.get('op')) : null;
  const opsDone = run.ranks.length ? opsList(ops, name, rank, panel, 0, op) : Promise.resolve();
  try {
    // The cross-rank report: collectives, plus replicas when asked for.
    const ranks = await api(`runs/${encodeURIComponent(name)}/ranks`);
    const odd = ranks.odd_ranks.length ? ` · ranks outside the majority: ${ranks.odd_ranks.join(', ')}` : '';
    collectives.replaceWith(el('p', { id: 'cross-rank' }, el('span', { class: `badge ${ranks.status}` }, ranks.status), `cross-rank${odd}`),
      matrix(ranks.collectives));
  } catch (e) {
    collectives.replaceChildren(el('p', { class: 'error' }, e.message));
  }
  await opsDone;
}

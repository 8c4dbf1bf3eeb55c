// "/": every run the daemon holds. Pick a reference and a suspect to compare,
// or open one run for its cross-rank view.
import { api, el, navigate, setTitle, sum } from './util.js';

export async function runsView(main) {
  setTitle('');
  const { runs } = await api('runs');
  if (!runs.length) {
    main.append(el('p', { class: 'muted' }, 'No runs yet: train with OPGUARD=1 OPGUARD_RUN=NAME.'));
    return;
  }
  const compare = el('button', { id: 'compare', disabled: true }, 'Compare');
  const choice = () => ['reference', 'suspect'].map((k) => main.querySelector(`input[name=${k}]:checked`)?.value);
  const update = () => {
    const [ref, sus] = choice();
    compare.disabled = !ref || !sus;
  };
  compare.addEventListener('click', () => {
    const [ref, sus] = choice();
    navigate(`/diff?${new URLSearchParams({ reference: ref, suspect: sus })}`);
  });
  const rows = runs.map((run) => {
    const settings = Object.entries(run.determinism).filter(([k]) => k !== 'mode');
    return el('tr', { 'data-run': run.name },
      el('td', {}, el('input', { type: 'radio', name: 'reference', value: run.name, onchange: update, title: 'reference' })),
      el('td', {}, el('input', { type: 'radio', name: 'suspect', value: run.name, onchange: update, title: 'suspect' })),
      el('td', {}, el('a', { href: `/run?name=${encodeURIComponent(run.name)}` }, run.name)),
      el('td', { class: 'num' }, run.ranks.length + (run.world_size > run.ranks.length ? ` of ${run.world_size}` : '')),
      el('td', { class: 'num' }, Math.max(0, ...run.ranks.map((r) => r.steps))),
      el('td', { class: 'num' }, sum(run.ranks, (r) => r.ops).toLocaleString('en')),
      el('td', { class: 'num' + (sum(run.ranks, (r) => r.gaps) ? ' warn' : '') }, sum(run.ranks, (r) => r.gaps)),
      el('td', {}, run.determinism.mode ?? ''),
      el('td', { class: 'small' }, settings.map(([k, v]) => `${k}=${v}`).join(' ')),
      el('td', {}, run.framework),
      el('td', {}, run.ranks.every((r) => r.ended) ? 'ended' : 'recording'));
  });
  main.append(
    el('h2', {}, 'Runs'),
    el('table', { class: 'runs' },
      el('thead', {}, el('tr', {}, ['ref', 'sus', 'run', 'ranks', 'steps', 'ops', 'gaps', 'mode', 'determinism', 'framework', 'state'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    el('p', {}, compare, ' the reference and suspect runs, or open a run for its ranks and collectives.'));
}

// The viewer's router: every view is a URL (docs/viewer.md), rendered into
// <main>. Links to a view navigate without reloading the page.
import { el, navigate } from './util.js';
import { runsView } from './runs.js';
import { diffView } from './diff.js';
import { runView } from './run.js';

const routes = { '/': runsView, '/diff': diffView, '/run': runView };
let generation = 0;  // a view started before the latest navigation stops drawing

async function render() {
  const main = document.getElementById('main');
  const mine = ++generation;
  main.replaceChildren();
  const view = routes[location.pathname];
  try {
    if (!view) throw new Error(`no view at ${location.pathname}`);
    await view(main, new URLSearchParams(location.search), () => mine === generation);
  } catch (e) {
    if (mine === generation) main.append(el('p', { class: 'error' }, e.message));
  }
}

document.addEventListener('click', (e) => {
  const a = e.target.closest('a[href]');
  if (!a || a.origin !== location.origin || !routes[a.pathname] || e.ctrlKey || e.metaKey || e.shiftKey) return;
  e.preventDefault();
  navigate(a.href);
});
window.addEventListener('popstate', render);
render();

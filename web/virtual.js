// A virtualised list: only the rows in (and just around) the viewport are in
// the DOM, positioned inside a spacer as tall as all rows; rows come from
// `fetchPage(from, count)` a page at a time and a bounded number of pages is
// cached. A million-row lane costs the DOM a few dozen elements.
import { el } from './util.js';

const PAGE = 200;
const CACHED_PAGES = 64;
const OVERSCAN = 10;
// Browsers cap an element's height (Chrome near 33.5M px): past this, scroll
// positions map onto row indices proportionally instead of 1:1.
const MAX_SPACER_PX = 15e6;

export class VirtualList {
  // total: row count; rowHeight: px; fetchPage(from, count) -> Promise<row[]>
  // (row i of the answer is row from + i); renderRow(row, index) -> Element.
  constructor({ total, rowHeight = 22, height = 480, fetchPage, renderRow, className = '' }) {
    Object.assign(this, { total, rowHeight, fetchPage, renderRow });
    this.pages = new Map();  // page index -> rows | Promise
    this.spacer = el('div', { class: 'vspacer' });
    this.scale = Math.min(1, MAX_SPACER_PX / Math.max(1, total * rowHeight));
    this.spacer.style.height = `${total * rowHeight * this.scale}px`;
    this.element = el('div', { class: `vlist ${className}`, tabindex: 0 }, this.spacer);
    this.element.style.height = `${height}px`;
    this.element.addEventListener('scroll', () => this.draw());
    this.selected = -1;
  }

  scrollToIndex(index) {
    const view = this.element.clientHeight || 480;
    this.element.scrollTop = Math.max(0, (index * this.rowHeight - view / 2 + this.rowHeight / 2) * this.scale);
    this.draw();
  }

  select(index) {
    this.selected = index;
    this.draw();
  }

  page(p) {
    let rows = this.pages.get(p);
    if (rows) return rows;
    if (this.pages.size >= CACHED_PAGES) this.pages.delete(this.pages.keys().next().value);
    const from = p * PAGE;
    rows = this.fetchPage(from, Math.min(PAGE, this.total - from)).then((r) => {
      this.pages.set(p, r);
      this.draw();
      return r;
    }, (e) => {
      this.pages.delete(p);
      this.element.dispatchEvent(new CustomEvent('fetcherror', { detail: e }));
    });
    this.pages.set(p, rows);
    return rows;
  }

  draw() {
    const top = this.element.scrollTop, view = this.element.clientHeight || 480;
    // The row at the top of the viewport, fractional; at the very bottom the
    // last rows must fit, whatever the scale.
    const bottom = top + view >= this.element.scrollHeight - 1;
    const exact = bottom ? Math.max(0, this.total - view / this.rowHeight) : top / this.scale / this.rowHeight;
    const first = Math.max(0, Math.floor(exact) - OVERSCAN);
    const last = Math.min(this.total, Math.ceil(exact + view / this.rowHeight) + OVERSCAN);
    // Rows already drawn from the same data keep their element (a click or
    // a selection survives redraws); the rest are built, the others removed.
    const drawn = new Map();
    for (let i = first; i < last; ++i) {
      const rows = this.page(Math.floor(i / PAGE));
      const row = Array.isArray(rows) ? rows[i % PAGE] : undefined;
      const old = this.drawn?.get(i);
      let node = old && old.row === row ? old.node : null;
      if (!node) {
        node = row === undefined ? el('div', { class: 'loading' }, '…') : this.renderRow(row, i);
        node.classList.add('vrow');
        node.dataset.index = i;
        node.style.height = `${this.rowHeight}px`;
        this.spacer.append(node);
      }
      node.classList.toggle('selected', i === this.selected);
      node.style.transform = `translateY(${top + (i - exact) * this.rowHeight}px)`;
      drawn.set(i, { node, row });
    }
    for (const [i, { node }] of this.drawn ?? []) if (drawn.get(i)?.node !== node) node.remove();
    this.drawn = drawn;
  }
}

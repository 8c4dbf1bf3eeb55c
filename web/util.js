// Small helpers shared by the views: DOM building, the JSON API, formatting.

// el('td', {class: 'x', title: 'y'}, child, 'text', ...): an element.
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c !== undefined && c !== null && c !== false) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

// GET /api/PATH?params as JSON; throws the daemon's one-line error.
export async function api(path, params = {}) {
  const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== undefined && v !== null));
  const url = `/api/${path}${query.size ? '?' + query : ''}`;
  const res = await fetch(url);
  const body = await res.json().catch(() => ({ error: `${res.status} ${res.statusText}` }));
  if (!res.ok) throw new Error(body.error || `${url}: ${res.status}`);
  return body;
}

export function setTitle(text) {
  document.title = text ? `${text} · OpGuard` : 'OpGuard';
  document.getElementById('title').textContent = text ? ` · ${text}` : '';
}

export const siteText = (s) => (s && s.file ? `${s.file.split('/').pop()}:${s.line}${s.function ? ' in ' + s.function : ''}` : '');
export const shapeText = (t) => `${t.dtype.toLowerCase()}[${t.shape.join(', ')}]`;
export const short = (hex) => (hex ? hex.slice(0, 12) + '…' : '');
export const sum = (xs, f) => xs.reduce((a, x) => a + f(x), 0);

// A scalar input's raw bits (16 hex digits, little-endian value) as the value
// its dtype means.
export function decodeScalar(bitsHex, dtype) {
  if (!bitsHex) return '';
  const dv = new DataView(new ArrayBuffer(8));
  dv.setBigUint64(0, BigInt('0x' + bitsHex), true);
  const half = (h) => {
    const e = (h >> 10) & 31, m = h & 1023, s = h >> 15 ? -1 : 1;
    if (e === 0) return s * m * 2 ** -24;
    if (e === 31) return m ? NaN : s * Infinity;
    return s * (1 + m / 1024) * 2 ** (e - 15);
  };
  switch (dtype) {
    case 'Float64': return dv.getFloat64(0, true);
    case 'Float32': return dv.getFloat32(0, true);
    case 'Float16': return half(dv.getUint16(0, true));
    case 'BFloat16': { const f = new DataView(new ArrayBuffer(4)); f.setUint32(0, dv.getUint16(0, true) << 16); return f.getFloat32(0); }
    case 'Int64': return dv.getBigInt64(0, true);
    case 'Int32': return dv.getInt32(0, true);
    case 'Int16': return dv.getInt16(0, true);
    case 'Int8': return dv.getInt8(0);
    case 'UInt8': return dv.getUint8(0);
    case 'UInt16': return dv.getUint16(0, true);
    case 'UInt32': return dv.getUint32(0, true);
    case 'Bool': return dv.getUint8(0) !== 0;
    default: return dv.getBigUint64(0, true);
  }
}

// Opens a view of this page (the router listens for popstate).
export function navigate(url, replace = false) {
  history[replace ? 'replaceState' : 'pushState'](null, '', url);
  if (!replace) window.dispatchEvent(new PopStateEvent('popstate'));
}

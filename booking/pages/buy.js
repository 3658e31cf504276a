// The seat picker: the venue drawn once on a canvas from the cacheable layout, coloured by the live status and
// kept live by the event's seat stream; seats picked by pointer or keyboard, or the best ones asked for; then
// the hold (countdown, more time), the checkout, the payment at the provider and the order until it is paid.
// Plain JavaScript, no build step, nothing fetched from another origin.
'use strict';
(() => {
  const eventId = Number(location.pathname.split('/')[2]);
  const base = `/events/${eventId}`;
  const $ = (id) => document.getElementById(id);
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const CODES = { a: 0, h: 1, s: 2 };
  const NAMES = ['available', 'held', 'sold'];
  const PALETTE = ['#2563eb', '#7c3aed', '#0d9488', '#c2410c', '#be123c', '#4d7c0f', '#0369a1', '#a16207'];
  const HELD = '#c9ced6';
  const SOLD = '#6e7781';
  const MINE = '#f59e0b';
  const MAX_BASKET = 8;

  const S = {
    seats: null, // the layout's seat arrays
    count: 0,
    status: null, // Uint8Array, 0 available, 1 held, 2 sold
    version: 0,
    currency: 'EUR',
    types: new Map(), // ticket type id -> { name, price, colour }
    index: new Map(), // seat id -> position
    grid: new Map(), // "x,y" -> position
    box: null,
    sections: [],
    selected: new Set(), // positions
    mine: new Set(), // positions of this fan's hold
    cursor: -1,
    hold: null,
    order: null,
    view: { scale: 1, tx: 0, ty: 0 },
    stream: null,
    dirty: false,
  };

  // ---- API -------------------------------------------------------------------------------------------------

  const newKey = () => (crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random().toString(16).slice(2)}`);

  /** A JSON call to this origin. Writes carry an Idempotency-Key, so a retry after a lost answer is safe; busy
   *  answers (429, 503) are retried after their Retry-After. */
  async function api(method, path, body, key) {
    const headers = { Accept: 'application/json' };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    if (key) headers['Idempotency-Key'] = key;
    for (let attempt = 0; ; attempt++) {
      let res;
      try {
        res = await fetch(path, {
          method, headers, credentials: 'same-origin', body: body === undefined ? undefined : JSON.stringify(body),
        });
      } catch (e) {
        if (attempt < 3 && (method === 'GET' || key)) { await sleep(500 * (attempt + 1)); continue; }
        throw e;
      }
      if ((res.status === 429 || res.status === 503) && attempt < 4) {
        await sleep(1000 * Number(res.headers.get('Retry-After') || 1));
        continue;
      }
      let data = {};
      try { data = await res.json(); } catch (_) { /* no JSON body */ }
      if (res.status === 401 && /^admission/.test(data.error || '')) {
        // The admission ran out or was never given: back to the waiting room, which brings the fan back here.
        location.assign(`/queue/${eventId}`);
      }
      return { status: res.status, data };
    }
  }

  // ---- words -----------------------------------------------------------------------------------------------

  const money = (cents) => `${(cents / 100).toFixed(2)} ${S.currency}`;
  const label = (i) => S.seats.label[i];
  const price = (i) => (S.types.get(S.seats.ticket_type_id[i]) || { price: 0 }).price;
  const seatName = (i) => {
    const parts = [label(i), money(price(i)), NAMES[S.status[i]]];
    if (S.seats.accessible[i]) parts.push('accessible');
    if (S.selected.has(i)) parts.push('selected');
    if (S.mine.has(i)) parts.push('held for you');
    return parts.join(', ');
  };

  function say(text, kind) {
    const box = $('message');
    box.textContent = text || '';
    box.className = kind === 'info' ? 'info' : '';
  }

  // ---- the map -------------------------------------------------------------------------------------------

  const canvas = $('map');
  const ctx = canvas.getContext('2d');

  function decodeStatus(packed, n) {
    const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = (bytes[i >> 2] >> ((i & 3) * 2)) & 3;
    return out;
  }

  function fit() {
    const r = canvas.getBoundingClientRect();
    const b = S.box;
    const scale = Math.min(r.width / (b.w + 2), r.height / (b.h + 2));
    S.view = { scale, tx: (r.width - b.w * scale) / 2, ty: (r.height - b.h * scale) / 2 };
    redraw();
  }

  const toScreen = (i) => ({
    x: (S.seats.x[i] - S.box.x0) * S.view.scale + S.view.tx,
    y: (S.seats.y[i] - S.box.y0) * S.view.scale + S.view.ty,
  });

  function colour(i) {
    if (S.mine.has(i) || S.selected.has(i)) return MINE;
    if (S.status[i] === 1) return HELD;
    if (S.status[i] === 2) return SOLD;
    return (S.types.get(S.seats.ticket_type_id[i]) || { colour: PALETTE[0] }).colour;
  }

  function redraw() {
    if (S.dirty) return;
    S.dirty = true;
    requestAnimationFrame(draw);
  }

  function draw() {
    S.dirty = false;
    if (!S.seats) return;
    const dpr = window.devicePixelRatio || 1;
    const r = canvas.getBoundingClientRect();
    if (canvas.width !== Math.round(r.width * dpr) || canvas.height !== Math.round(r.height * dpr)) {
      canvas.width = Math.round(r.width * dpr);
      canvas.height = Math.round(r.height * dpr);
    }
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, r.width, r.height);
    const s = S.view.scale;
    const size = Math.max(1, s * 0.8);
    const half = size / 2;
    const buckets = new Map();
    for (let i = 0; i < S.count; i++) {
      const p = toScreen(i);
      if (p.x < -size || p.y < -size || p.x > r.width + size || p.y > r.height + size) continue;
      const c = colour(i);
      let list = buckets.get(c);
      if (!list) buckets.set(c, (list = []));
      list.push(p.x - half, p.y - half);
    }
    for (const [c, list] of buckets) {
      ctx.fillStyle = c;
      for (let k = 0; k < list.length; k += 2) ctx.fillRect(list[k], list[k + 1], size, size);
    }
    if (s >= 6) {
      // Close enough to read: sold seats get a cross, picked ones a ring.
      ctx.lineWidth = Math.max(1, s / 12);
      for (let i = 0; i < S.count; i++) {
        if (S.status[i] !== 2 && !S.selected.has(i)) continue;
        const p = toScreen(i);
        if (p.x < -size || p.y < -size || p.x > r.width + size || p.y > r.height + size) continue;
        ctx.strokeStyle = S.selected.has(i) ? '#1f2328' : '#ffffff';
        ctx.beginPath();
        if (S.selected.has(i)) {
          ctx.strokeRect(p.x - half, p.y - half, size, size);
        } else {
          ctx.moveTo(p.x - half / 2, p.y - half / 2); ctx.lineTo(p.x + half / 2, p.y + half / 2);
          ctx.moveTo(p.x + half / 2, p.y - half / 2); ctx.lineTo(p.x - half / 2, p.y + half / 2);
          ctx.stroke();
        }
      }
    }
    if (s >= 6) {
      // Section names in the gap above each section.
      ctx.fillStyle = '#57606a';
      ctx.font = `600 ${Math.min(14, s * 1.1)}px system-ui, sans-serif`;
      ctx.textAlign = 'center';
      ctx.textBaseline = 'middle';
      for (const b of S.sections) {
        const x = ((b.x0 + b.x1) / 2 - S.box.x0) * s + S.view.tx;
        const y = (b.y0 - 1 - S.box.y0) * s + S.view.ty;
        if (x > -200 && y > -20 && x < r.width + 200 && y < r.height + 20) ctx.fillText(b.name, x, y);
      }
    }
    if (S.cursor >= 0) {
      const p = toScreen(S.cursor);
      ctx.strokeStyle = '#111';
      ctx.lineWidth = 2;
      ctx.strokeRect(p.x - half - 3, p.y - half - 3, size + 6, size + 6);
    }
  }

  function zoom(factor, cx, cy) {
    const r = canvas.getBoundingClientRect();
    const x = cx ?? r.width / 2;
    const y = cy ?? r.height / 2;
    const v = S.view;
    const scale = Math.min(60, Math.max(0.05, v.scale * factor));
    const k = scale / v.scale;
    S.view = { scale, tx: x - (x - v.tx) * k, ty: y - (y - v.ty) * k };
    redraw();
  }

  /** Pans the map so seat i is in view, zooming in to a readable size when the map is too small to pick from. */
  function show(i) {
    const r = canvas.getBoundingClientRect();
    if (S.view.scale < 8) zoom(8 / S.view.scale, r.width / 2, r.height / 2);
    const p = toScreen(i);
    const m = 30;
    if (p.x < m || p.y < m || p.x > r.width - m || p.y > r.height - m) {
      S.view.tx += r.width / 2 - p.x;
      S.view.ty += r.height / 2 - p.y;
    }
    redraw();
  }

  function seatAt(clientX, clientY) {
    const r = canvas.getBoundingClientRect();
    const lx = (clientX - r.left - S.view.tx) / S.view.scale + S.box.x0;
    const ly = (clientY - r.top - S.view.ty) / S.view.scale + S.box.y0;
    const i = S.grid.get(`${Math.round(lx)},${Math.round(ly)}`);
    if (i === undefined) return -1;
    return Math.abs(S.seats.x[i] - lx) <= 0.5 && Math.abs(S.seats.y[i] - ly) <= 0.5 ? i : -1;
  }

  function refreshFocus() {
    if (S.cursor >= 0) $('seat-focus').textContent = seatName(S.cursor);
  }

  function focusSeat(i) {
    S.cursor = i;
    $('seat-focus').textContent = i >= 0 ? seatName(i) : '';
    if (i >= 0) show(i);
    redraw();
  }

  function move(dx, dy) {
    if (S.cursor < 0) {
      const first = S.status.findIndex((s) => s === 0);
      return focusSeat(first >= 0 ? first : 0);
    }
    const x = S.seats.x[S.cursor];
    const y = S.seats.y[S.cursor];
    for (let step = 1; step <= 6; step++) {
      const i = S.grid.get(`${x + dx * step},${y + dy * step}`);
      if (i !== undefined) return focusSeat(i);
    }
  }

  // ---- picking -------------------------------------------------------------------------------------------

  const rowOf = (i) => `${S.seats.section[i]}/${S.seats.row[i]}`;

  /** Up to three blocks of n free side-by-side seats nearest to the given seats on the map (the distance between
   *  the blocks' centres, as booking measures it), no two sharing a seat. */
  function nearby(around, n) {
    if (!around.length || n < 1) return [];
    const cx = around.reduce((t, i) => t + S.seats.x[i], 0) / around.length;
    const cy = around.reduce((t, i) => t + S.seats.y[i], 0) / around.length;
    const blocks = [];
    let run = [];
    const flush = () => {
      for (let k = 0; k + n <= run.length; k++) {
        const b = run.slice(k, k + n);
        const x = b.reduce((t, i) => t + S.seats.x[i], 0) / n;
        const y = b.reduce((t, i) => t + S.seats.y[i], 0) / n;
        blocks.push({ seats: b, d: Math.hypot(x - cx, y - cy) });
      }
      run = [];
    };
    for (let i = 0; i < S.count; i++) {
      const free = S.status[i] === 0 && !S.selected.has(i);
      const joins = run.length && rowOf(i) === rowOf(run[run.length - 1])
        && S.seats.number[i] === S.seats.number[run[run.length - 1]] + 1;
      if (!joins) flush();
      if (free) run.push(i); else flush();
    }
    flush();
    blocks.sort((a, b) => a.d - b.d || a.seats[0] - b.seats[0]);
    const used = new Set();
    const out = [];
    for (const b of blocks) {
      if (b.seats.some((i) => used.has(i))) continue;
      b.seats.forEach((i) => used.add(i));
      out.push({
        seat_ids: b.seats.map((i) => S.seats.seat_id[i]),
        labels: b.seats.map(label),
        total_cents: b.seats.reduce((t, i) => t + price(i), 0),
      });
      if (out.length === 3) break;
    }
    return out;
  }

  /** A block's name: "Block 102 Row J, seats 10-12" for one row's seats, else their labels. */
  function blockName(positions) {
    const first = positions[0];
    const sameRow = positions.every((i) => rowOf(i) === rowOf(first));
    const section = S.sections[S.seats.section[first]];
    if (!sameRow || !section) return positions.map(label).join(', ');
    const numbers = positions.map((i) => S.seats.number[i]).sort((a, b) => a - b);
    const seats = numbers.length === 1 ? `seat ${numbers[0]}` : `seats ${numbers[0]}–${numbers[numbers.length - 1]}`;
    return `${section.name} Row ${S.seats.row[first]}, ${seats}`;
  }

  /** Seats that went: say which, and offer the nearest free blocks for the basket they were part of. */
  function lost(seats, size) {
    const names = seats.map(label);
    const offered = nearby(seats, size);
    say(`${names.join(', ')} ${names.length > 1 ? 'were' : 'was'} just taken by another fan.${offered.length ? ' Here are free seats nearby.' : ''}`);
    showAlternatives(offered);
  }

  function toggle(i) {
    if (i < 0 || S.hold || S.order) return;
    if (S.selected.has(i)) {
      S.selected.delete(i);
    } else if (S.status[i] !== 0) {
      lost([i], S.selected.size + 1);
      return;
    } else if (S.selected.size >= MAX_BASKET) {
      say(`At most ${MAX_BASKET} seats in one basket.`);
      return;
    } else {
      S.selected.add(i);
      say('');
    }
    renderSelection();
    if (S.cursor === i) $('seat-focus').textContent = seatName(i);
    redraw();
  }

  function seatList(list, positions, removable) {
    list.replaceChildren(...positions.map((i) => {
      const li = document.createElement('li');
      const text = document.createElement('span');
      text.textContent = `${label(i)} · ${money(price(i))}`;
      li.append(text);
      if (removable) {
        const b = document.createElement('button');
        b.type = 'button';
        b.className = 'link';
        b.textContent = 'Remove';
        b.setAttribute('aria-label', `Remove ${label(i)}`);
        b.addEventListener('click', () => toggle(i));
        li.append(b);
      }
      return li;
    }));
  }

  function renderSelection() {
    const picked = [...S.selected];
    seatList($('selection'), picked, true);
    $('selection-empty').hidden = picked.length > 0;
    $('selection-total').textContent = picked.length ? `${picked.length} seat${picked.length > 1 ? 's' : ''}, ${money(picked.reduce((t, i) => t + price(i), 0))}` : '';
    $('hold').disabled = picked.length === 0;
    $('hold').textContent = picked.length ? `Hold ${picked.length} seat${picked.length > 1 ? 's' : ''}` : 'Hold these seats';
  }

  function showAlternatives(alternatives) {
    const box = $('alternatives');
    box.hidden = !alternatives || alternatives.length === 0;
    if (box.hidden) return;
    $('alternative-list').replaceChildren(...alternatives.map((alt) => {
      const li = document.createElement('li');
      const text = document.createElement('span');
      li.dataset.seats = alt.seat_ids.join(',');
      const at = alt.seat_ids.map((id) => S.index.get(id));
      const name = at.every((i) => i !== undefined) ? blockName(at) : alt.labels.join(', ');
      text.textContent = `${name} · ${money(alt.total_cents)}`;
      const b = document.createElement('button');
      b.type = 'button';
      b.textContent = 'Hold these';
      b.setAttribute('aria-label', `Hold ${name}`);
      b.addEventListener('click', () => requestHold({ seat_ids: alt.seat_ids }));
      li.append(text, b);
      return li;
    }));
  }

  let busy = false;
  async function requestHold(body) {
    if (busy) return;
    busy = true;
    $('hold').disabled = true;
    $('best-go').disabled = true;
    try {
      const { status, data } = await api('POST', `${base}/holds`, body, newKey());
      if (status === 201) {
        S.selected.clear();
        showAlternatives(null);
        say('');
        startHold(data);
        return;
      }
      if (data.error === 'seat_unavailable') {
        const i = S.index.get(data.seat_id);
        if (i !== undefined) {
          if (S.status[i] === 0) S.status[i] = 1; // grey at once; the stream confirms
          S.selected.delete(i);
        }
        say(`${data.label} was just taken by another fan.${data.alternatives && data.alternatives.length ? ' Here are free seats nearby.' : ''}`);
        showAlternatives(data.alternatives);
        redraw();
        return;
      } else if (data.error === 'no_seats_together') {
        say(`No ${body.best_available.quantity} seats side by side are free${data.largest_block ? `: at most ${data.largest_block} together` : ''}.`);
      } else {
        say(data.message || `Could not hold the seats (${status}).`);
      }
      renderSelection();
      redraw();
    } catch (_) {
      say('The connection dropped. Your seats are not held yet: try again.');
    } finally {
      busy = false;
      $('best-go').disabled = false;
      renderSelection();
    }
  }

  // ---- the hold ------------------------------------------------------------------------------------------

  let ticking = null;
  function startHold(hold) {
    S.hold = hold;
    S.mine = new Set(hold.seats.map((s) => S.index.get(s.seat_id)).filter((i) => i !== undefined));
    for (const i of S.mine) S.status[i] = 1;
    seatList($('hold-seats'), [...S.mine], false);
    $('hold-total').textContent = `${hold.seats.length} seat${hold.seats.length > 1 ? 's' : ''}, ${money(hold.total_cents)}`;
    $('pick-panel').hidden = true;
    $('hold-panel').hidden = false;
    clearInterval(ticking);
    ticking = setInterval(tick, 250);
    tick();
    refreshFocus();
    redraw();
    $('checkout').focus();
  }

  function tick() {
    if (!S.hold) return;
    const left = Math.round((Date.parse(S.hold.expires_at) - Date.now()) / 1000);
    if (left <= 0) {
      endHold();
      say('Your hold ran out, and the seats may have gone to someone else.');
      return;
    }
    const t = $('hold-timer');
    t.textContent = `${Math.floor(left / 60)}:${String(left % 60).padStart(2, '0')} left to check out`;
    t.classList.toggle('low', left < 60);
  }

  function endHold() {
    clearInterval(ticking);
    S.hold = null;
    S.mine.clear();
    $('hold-panel').hidden = true;
    $('pick-panel').hidden = false;
    renderSelection();
    redraw();
  }

  $('extend').addEventListener('click', async () => {
    const { status, data } = await api('POST', `${base}/holds/${S.hold.hold_token}/extend`, undefined);
    if (status === 200) {
      S.hold.expires_at = data.expires_at;
      say('You have more time.', 'info');
      tick();
    } else if (data.error === 'hold_expired') {
      endHold();
      say('Your hold ran out, and the seats may have gone to someone else.');
    } else {
      say(data.message || 'Could not extend the hold.');
    }
  });

  $('release').addEventListener('click', async () => {
    await api('DELETE', `${base}/holds/${S.hold.hold_token}`, undefined);
    endHold();
    say('The seats are released.', 'info');
  });

  $('checkout').addEventListener('click', async () => {
    const token = S.hold.hold_token;
    $('checkout').disabled = true;
    try {
      const { status, data } = await api('POST', `${base}/orders`, { hold_token: token }, `checkout-${token}`);
      if (status === 201) {
        clearInterval(ticking);
        S.hold = null;
        history.replaceState(null, '', `#order=${data.order_id}`);
        showOrder(data);
      } else {
        if (data.error === 'hold_expired' || data.error === 'seat_sold') endHold();
        say(data.message || `Checkout failed (${status}).`);
      }
    } finally {
      $('checkout').disabled = false;
    }
  });

  // ---- the order -----------------------------------------------------------------------------------------

  let following = null;
  function showOrder(order) {
    const first = !S.order || S.order.status !== order.status;
    S.order = order;
    $('pick-panel').hidden = true;
    $('hold-panel').hidden = true;
    $('order-panel').hidden = false;
    S.mine = new Set(order.seats.map((s) => S.index.get(s.seat_id)).filter((i) => i !== undefined));
    seatList($('order-seats'), [...S.mine], false);
    $('order-total').textContent = `${order.seats.length} seat${order.seats.length > 1 ? 's' : ''}, ${money(order.total_cents)}`;
    const st = $('order-status');
    st.className = '';
    if (order.status === 'paid') {
      st.textContent = 'Paid. The seats are yours: enjoy the show!';
      st.className = 'paid';
    } else if (order.status === 'reserved') {
      const due = new Date(order.payment_due_at).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
      st.textContent = `Reserved for you until ${due}. Pay to make the seats yours.`;
    } else {
      st.textContent = `This order is ${order.status.replace('_', ' ')}${order.cancel_reason ? ` (${order.cancel_reason.replace('_', ' ')})` : ''}.`;
    }
    $('pay').hidden = order.status !== 'reserved';
    $('again').hidden = order.status === 'reserved';
    $('done').hidden = order.status !== 'paid';
    if (first) (order.status === 'reserved' ? $('pay') : $('again')).focus();
    refreshFocus();
    redraw();
  }

  /** Follows an order until it is no longer waiting for its payment. */
  async function follow(orderId) {
    clearTimeout(following);
    const { status, data } = await api('GET', `${base}/orders/${orderId}`, undefined);
    if (status !== 200) {
      say(data.message || 'This order was not found.');
      history.replaceState(null, '', location.pathname);
      return;
    }
    showOrder(data);
    if (data.status === 'reserved') following = setTimeout(() => follow(orderId), 1000);
  }

  $('pay').addEventListener('click', async () => {
    const id = S.order.order_id;
    $('pay').disabled = true;
    const { status, data } = await api('POST', `${base}/orders/${id}/payment`, undefined);
    $('pay').disabled = false;
    if (status !== 201) {
      say(data.message || 'The payment could not be started.');
      return;
    }
    const back = `${location.origin}${location.pathname}#order=${id}`;
    const checkout = new URL(data.checkout_url);
    checkout.searchParams.set('return', back);
    location.assign(checkout.toString());
  });

  $('again').addEventListener('click', () => {
    clearTimeout(following);
    S.order = null;
    S.mine.clear();
    history.replaceState(null, '', location.pathname);
    $('order-panel').hidden = true;
    $('pick-panel').hidden = false;
    say('');
    renderSelection();
    redraw();
  });

  // A fan who has what it came for leaves the waiting room: its slot goes to the next fan at once, and its
  // admission ends (the order stays the fan's, in the platform's account pages).
  $('done').addEventListener('click', async () => {
    clearTimeout(following);
    $('done').disabled = true;
    let status = 0;
    try {
      const res = await fetch(`/queue/${eventId}/leave`, { method: 'POST', credentials: 'same-origin', headers: { Accept: 'application/json' } });
      status = res.status;
    } catch (_) { /* reported below */ }
    $('done').disabled = false;
    if (status !== 200) {
      say('We could not tell the waiting room you are done; your admission ends by itself shortly.');
      return;
    }
    $('again').hidden = true;
    $('done').hidden = true;
    say('Done. Your place went to the next fan in line. Enjoy the show!', 'info');
  });

  // ---- live --------------------------------------------------------------------------------------------

  function applyChanges(changes) {
    const gone = [];
    const basket = S.selected.size;
    for (const [seat, code] of changes) {
      const i = S.index.get(seat);
      if (i === undefined) continue;
      S.status[i] = CODES[code] ?? S.status[i];
      if (S.status[i] !== 0 && S.selected.has(i)) {
        S.selected.delete(i);
        gone.push(i);
      }
      if (i === S.cursor) $('seat-focus').textContent = seatName(i);
    }
    if (gone.length) {
      lost(gone, basket);
      renderSelection();
    }
    redraw();
  }

  async function loadStatus() {
    const { status, data } = await api('GET', `${base}/seats/status`, undefined);
    if (status !== 200) throw new Error(data.message || `status ${status}`);
    return data;
  }

  function subscribe() {
    if (S.stream) S.stream.close();
    const es = new EventSource(`${base}/seats/stream?since=${S.version}`);
    S.stream = es;
    const live = $('live');
    es.onopen = () => { live.textContent = 'Live'; live.className = 'live on'; };
    es.onerror = () => { live.textContent = 'Reconnecting…'; live.className = 'live'; };
    es.addEventListener('delta', (ev) => {
      const d = JSON.parse(ev.data);
      if (S.version !== 0 && d.from !== S.version + 1) return resync();
      applyChanges(d.changes);
      S.version = d.version;
    });
    es.addEventListener('resync', () => resync());
  }

  async function resync() {
    if (S.stream) S.stream.close();
    S.stream = null;
    try {
      const st = await loadStatus();
      S.status = decodeStatus(st.statuses, S.count);
      for (const i of S.mine) if (S.status[i] === 0) S.mine.delete(i);
      S.version = st.version;
      redraw();
    } catch (_) {
      await sleep(2000);
    }
    subscribe();
  }

  // ---- input -------------------------------------------------------------------------------------------

  const pointers = new Map();
  let dragged = false;
  let pinch = 0;
  canvas.addEventListener('pointerdown', (e) => {
    canvas.setPointerCapture(e.pointerId);
    pointers.set(e.pointerId, { x: e.clientX, y: e.clientY });
    dragged = false;
    if (pointers.size === 2) {
      const [a, b] = [...pointers.values()];
      pinch = Math.hypot(a.x - b.x, a.y - b.y);
    }
  });
  canvas.addEventListener('pointermove', (e) => {
    const last = pointers.get(e.pointerId);
    if (!last) return;
    const dx = e.clientX - last.x;
    const dy = e.clientY - last.y;
    pointers.set(e.pointerId, { x: e.clientX, y: e.clientY });
    if (pointers.size === 2) {
      const [a, b] = [...pointers.values()];
      const d = Math.hypot(a.x - b.x, a.y - b.y);
      const r = canvas.getBoundingClientRect();
      if (pinch > 0) zoom(d / pinch, (a.x + b.x) / 2 - r.left, (a.y + b.y) / 2 - r.top);
      pinch = d;
      dragged = true;
      return;
    }
    if (Math.abs(dx) + Math.abs(dy) > 0 && (dragged || Math.hypot(dx, dy) > 3)) {
      dragged = true;
      S.view.tx += dx;
      S.view.ty += dy;
      redraw();
    }
  });
  const up = (e) => {
    const was = pointers.has(e.pointerId);
    pointers.delete(e.pointerId);
    if (pointers.size < 2) pinch = 0;
    if (was && !dragged && e.type === 'pointerup') {
      const i = seatAt(e.clientX, e.clientY);
      if (i >= 0) {
        S.cursor = i;
        $('seat-focus').textContent = seatName(i);
        toggle(i);
      }
    }
  };
  canvas.addEventListener('pointerup', up);
  canvas.addEventListener('pointercancel', up);
  canvas.addEventListener('wheel', (e) => {
    e.preventDefault();
    const r = canvas.getBoundingClientRect();
    zoom(Math.exp(-e.deltaY / 300), e.clientX - r.left, e.clientY - r.top);
  }, { passive: false });
  canvas.addEventListener('keydown', (e) => {
    const keys = {
      ArrowLeft: () => move(-1, 0), ArrowRight: () => move(1, 0), ArrowUp: () => move(0, -1), ArrowDown: () => move(0, 1),
      Enter: () => toggle(S.cursor), ' ': () => toggle(S.cursor), '+': () => zoom(1.5), '=': () => zoom(1.5),
      '-': () => zoom(1 / 1.5), Home: () => fit(),
    };
    const act = keys[e.key];
    if (!act) return;
    e.preventDefault();
    act();
  });
  canvas.addEventListener('focus', () => { if (S.cursor < 0 && S.seats) move(0, 0); });
  $('zoom-in').addEventListener('click', () => zoom(1.5));
  $('zoom-out').addEventListener('click', () => zoom(1 / 1.5));
  $('zoom-fit').addEventListener('click', () => fit());
  $('hold').addEventListener('click', () => requestHold({ seat_ids: [...S.selected].map((i) => S.seats.seat_id[i]) }));
  $('best').addEventListener('submit', (e) => {
    e.preventDefault();
    const ask = { quantity: Number($('best-quantity').value) };
    if ($('best-accessible').checked) ask.accessible = true;
    requestHold({ best_available: ask });
  });
  window.addEventListener('resize', () => redraw());

  // ---- start -------------------------------------------------------------------------------------------

  function legend() {
    const items = [...S.types.values()].map((t) => [t.colour, `${t.name} ${money(t.price)}`]);
    items.push([MINE, 'Yours'], [HELD, 'Held'], [SOLD, 'Sold']);
    $('legend').replaceChildren(...items.map(([c, text]) => {
      const li = document.createElement('li');
      const sw = document.createElement('span');
      sw.className = 'swatch';
      sw.style.background = c;
      li.append(sw, text);
      return li;
    }));
  }

  async function start() {
    const [info, st] = await Promise.all([api('GET', base, undefined), loadStatus()]);
    if (info.status === 200) {
      const e = info.data;
      $('event-name').textContent = e.name;
      document.title = `${e.name}: choose your seats`;
      $('event-info').textContent = `${e.venue} · ${new Date(e.starts_at).toLocaleString([], { dateStyle: 'medium', timeStyle: 'short' })}`;
    }
    const res = await fetch(st.layout, { headers: { Accept: 'application/json' } });
    const layout = await res.json();
    S.currency = layout.currency;
    layout.ticket_types.forEach((t, k) => S.types.set(t.ticket_type_id, { name: t.name, price: t.price_cents, colour: PALETTE[k % PALETTE.length] }));
    S.seats = layout.seats;
    S.count = layout.seats.seat_id.length;
    let x0 = Infinity; let y0 = Infinity; let x1 = -Infinity; let y1 = -Infinity;
    for (let i = 0; i < S.count; i++) {
      const x = S.seats.x[i]; const y = S.seats.y[i];
      S.index.set(S.seats.seat_id[i], i);
      S.grid.set(`${x},${y}`, i);
      x0 = Math.min(x0, x); y0 = Math.min(y0, y); x1 = Math.max(x1, x); y1 = Math.max(y1, y);
    }
    S.box = { x0: x0 - 1, y0: y0 - 1, w: x1 - x0 + 2, h: y1 - y0 + 2 };
    // As tall as the venue drawn across the page's width needs, within the screen.
    const wide = canvas.getBoundingClientRect().width;
    canvas.style.height = `${Math.round(Math.min(window.innerHeight * 0.7, Math.max(220, (wide * S.box.h) / S.box.w + 40)))}px`;
    S.sections = layout.sections.map((name) => ({ name, x0: Infinity, y0: Infinity, x1: -Infinity }));
    for (let i = 0; i < S.count; i++) {
      const b = S.sections[S.seats.section[i]];
      if (!b) continue;
      b.x0 = Math.min(b.x0, S.seats.x[i]); b.x1 = Math.max(b.x1, S.seats.x[i]); b.y0 = Math.min(b.y0, S.seats.y[i]);
    }
    S.status = decodeStatus(st.statuses, S.count);
    S.version = st.version;
    legend();
    fit();
    renderSelection();
    subscribe();
    const order = new URLSearchParams(location.hash.slice(1)).get('order');
    if (order) follow(order);
  }

  // For scripts and tests: what the page shows of a seat, and where it is on screen.
  window.seatMap = {
    statusOf: (seatId) => (S.index.has(seatId) ? NAMES[S.status[S.index.get(seatId)]] : undefined),
    version: () => S.version,
    seatIds: () => Array.from(S.seats ? S.seats.seat_id : []),
    screenPoint: (seatId) => {
      const i = S.index.get(seatId);
      if (i === undefined) return null;
      const r = canvas.getBoundingClientRect();
      const p = toScreen(i);
      return { x: r.left + p.x, y: r.top + p.y };
    },
    show: (seatId) => { const i = S.index.get(seatId); if (i !== undefined) focusSeat(i); },
  };

  start().catch((e) => say(`The seat map could not be loaded: ${e.message}`));
})();

// infertrace dashboard. No build step: plain browser JavaScript over the collector's JSON API,
// charts by uPlot (vendored). Every chart element exposes what it shows on data attributes
// (data-points, data-x-min, data-x-max, data-last) so the browser test can check it.
'use strict';
(function () {
  // ---------------------------------------------------------------- state
  const MAX_POLLS = 4320; // client-side history: 6 h at the default 5 s poll
  const HISTORY_REFRESH_MS = 60000;
  const state = {
    settings: {
      slo: { ttft_seconds: 1, tpot_seconds: 0.1, e2e_seconds: 30 },
      windows_seconds: [60, 300, 3600],
      poll_interval_ms: 5000,
      history: false,
    },
    range: 900,
    model: '',
    service: '',
    polls: [], // [{t, rows: [{service, model, operation, flat}]}]
    history: new Map(), // kpi path -> [[t, v], ...] for the current selection
    historyKey: '',
    historyAt: 0,
    charts: new Map(), // id -> {u, spec}
    selectedTrace: null,
    pollCount: 0,
    lastError: '',
    lastOkAt: 0,
    timer: null,
    token: '',
  };

  const $ = (s) => document.querySelector(s);
  const esc = (s) => String(s == null ? '' : s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  const num = (v) => (typeof v === 'number' && isFinite(v) ? v : null);
  // Markup built here carries positions as data-css="prop:value;..." rather than a style attribute:
  // the page's Content-Security-Policy allows no inline style attribute, but styles set through
  // the CSSOM are allowed. Call after every innerHTML that uses data-css.
  function applyCss(root) {
    for (const el of root.querySelectorAll('[data-css]')) {
      for (const decl of el.dataset.css.split(';')) {
        const i = decl.indexOf(':');
        if (i > 0) el.style.setProperty(decl.slice(0, i).trim(), decl.slice(i + 1).trim());
      }
    }
  }

  // ---------------------------------------------------------------- formatting
  function fmtSec(v) {
    if (v == null) return '–';
    const a = Math.abs(v);
    if (a === 0) return '0';
    if (a < 1e-3) return (v * 1e6).toFixed(a < 1e-5 ? 2 : 0) + ' µs';
    if (a < 1) return (v * 1e3).toFixed(a < 0.01 ? 2 : a < 0.1 ? 1 : 0) + ' ms';
    if (a < 60) return v.toFixed(a < 10 ? 2 : 1) + ' s';
    return (v / 60).toFixed(1) + ' min';
  }
  function fmtNum(v, digits) {
    if (v == null) return '–';
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    return v.toFixed(digits == null ? (a < 10 ? 2 : a < 100 ? 1 : 0) : digits);
  }
  const fmtPct = (v) => (v == null ? '–' : (v * 100).toFixed(v < 0.1 ? 1 : 0) + '%');
  const fmtPctRaw = (v) => (v == null ? '–' : v.toFixed(v < 10 ? 1 : 0) + '%');
  const fmtTime = (unixNano) => new Date(unixNano / 1e6).toLocaleTimeString();
  const fmtWindow = (s) => (s % 3600 === 0 ? s / 3600 + 'h' : s % 60 === 0 ? s / 60 + 'm' : s + 's');

  // ---------------------------------------------------------------- KPI paths
  // Paths follow the alert expression grammar (`ttft.p99`, `phase_share.p99.queue`, ...), the
  // same names `GET /api/history?kpi=` takes. `gpu.attributed_power` (W) is client-side only.
  const LAT = ['e2e', 'ttft', 'tpot'];
  const PCT = ['p50', 'p90', 'p99'];
  const PHASES = ['queue', 'prefill', 'decode'];
  const CLIENT_ONLY = new Set(['gpu.attributed_power']);

  // One series of a snapshot, flattened to {path: number|null} plus the weights used to
  // combine several series.
  function flatten(s, windowSeconds) {
    const f = {};
    for (const name of LAT) for (const p of PCT) f[name + '.' + p] = s[name] ? num(s[name][p]) : null;
    for (const tail of ['all', 'p99']) {
      const sh = s.phase_share && s.phase_share[tail];
      for (const ph of PHASES) f['phase_share.' + tail + '.' + ph] = sh ? num(sh[ph]) : null;
    }
    const t = s.throughput || {};
    f['throughput.requests_per_second'] = num(t.requests_per_second);
    f['throughput.output_tokens_per_second'] = num(t.output_tokens_per_second);
    f['throughput.input_tokens_per_second'] = num(t.input_tokens_per_second);
    f['goodput.requests_per_second'] = s.goodput ? num(s.goodput.requests_per_second) : null;
    f['goodput.ratio'] = s.goodput ? num(s.goodput.ratio) : null;
    const req = s.requests || 0;
    f.error_rate = req ? s.errors / req : null;
    f.cancel_rate = req ? s.cancelled / req : null;
    f.rejection_rate = req ? s.rejected / req : null;
    const g = s.gpu;
    for (const ph of PHASES) f['gpu.utilization.' + ph] = g && g.utilization_mean ? num(g.utilization_mean[ph]) : null;
    f['gpu.energy_per_output_token'] = g ? num(g.energy_per_output_token_joules) : null;
    // Over the seconds the API's rates cover (requests ÷ requests/s: fewer than the window's
    // while the collector has run for less than it), else the window's.
    const rps = num(t.requests_per_second);
    const covered = req > 0 && rps > 0 ? req / rps : windowSeconds;
    f['gpu.attributed_power'] = g && covered > 0 ? num(g.energy_attributed_joules) / covered : null;
    // weights
    f._req = req;
    f._errors = s.errors || 0;
    f._cancelled = s.cancelled || 0;
    f._rejected = s.rejected || 0;
    f._ok = Math.max(0, req - f._errors - f._cancelled - f._rejected);
    f._gpu = g ? g.requests || 0 : 0;
    f._out = s.tokens ? s.tokens.output || 0 : 0;
    return f;
  }

  const SUM = new Set(['throughput.requests_per_second', 'throughput.output_tokens_per_second', 'throughput.input_tokens_per_second', 'goodput.requests_per_second', 'gpu.attributed_power']);

  // Several series into one: rates add up, ratios are recomputed from counts, shares are
  // weighted by ok requests, percentiles take the worst series (they cannot be merged here).
  function combine(flats) {
    if (flats.length === 0) return null;
    if (flats.length === 1) return flats[0];
    const out = {};
    const keys = Object.keys(flats[0]).filter((k) => k[0] !== '_');
    const w = (f, k) => (k.startsWith('gpu.utilization') ? f._gpu : k === 'gpu.energy_per_output_token' ? f._out : k === 'goodput.ratio' ? f._req - f._cancelled : f._ok);
    for (const k of keys) {
      const vals = flats.map((f) => [f[k], w(f, k)]).filter(([v]) => v != null);
      if (vals.length === 0) { out[k] = null; continue; }
      if (SUM.has(k)) out[k] = vals.reduce((a, [v]) => a + v, 0);
      else if (/\.p\d+$/.test(k) && !k.startsWith('phase_share')) out[k] = Math.max.apply(null, vals.map(([v]) => v));
      else {
        const tw = vals.reduce((a, [, x]) => a + x, 0);
        out[k] = tw > 0 ? vals.reduce((a, [v, x]) => a + v * x, 0) / tw : vals[0][0];
      }
    }
    const tot = (k) => flats.reduce((a, f) => a + f[k], 0);
    const req = tot('_req');
    out.error_rate = req ? tot('_errors') / req : null;
    out.cancel_rate = req ? tot('_cancelled') / req : null;
    out.rejection_rate = req ? tot('_rejected') / req : null;
    for (const k of ['_req', '_errors', '_cancelled', '_rejected', '_ok', '_gpu', '_out']) out[k] = tot(k);
    return out;
  }

  const matches = (r) => (!state.model || r.model === state.model) && (!state.service || r.service === state.service);

  // The selection's value of every path at every poll.
  function liveSeries() {
    return state.polls.map((p) => ({ t: p.t, f: combine(p.rows.filter(matches).map((r) => r.flat)) }));
  }

  // ---------------------------------------------------------------- chart specs
  function latencySpec(name, sloKey) {
    return {
      unit: 's',
      lines: PCT.map((p, i) => ({ path: name + '.' + p, label: p, color: ['--p50', '--p90', '--p99'][i] })),
      slo: () => state.settings.slo[sloKey],
    };
  }
  const SPECS = {
    'chart-e2e': latencySpec('e2e', 'e2e_seconds'),
    'chart-ttft': latencySpec('ttft', 'ttft_seconds'),
    'chart-tpot': latencySpec('tpot', 'tpot_seconds'),
    'chart-throughput': {
      unit: '/s',
      lines: [
        { path: 'throughput.requests_per_second', label: 'requests/s', color: '--p50' },
        { path: 'goodput.requests_per_second', label: 'goodput/s', color: '--good', dash: [4, 3] },
        { path: 'throughput.output_tokens_per_second', label: 'output tokens/s', color: '--prefill', scale: 'r' },
      ],
      right: { unit: 'tok/s' },
    },
    'chart-phases-all': { stacked: true, lines: PHASES.map((ph) => ({ path: 'phase_share.all.' + ph, label: ph, color: '--' + ph })) },
    'chart-phases-slow': { stacked: true, lines: PHASES.map((ph) => ({ path: 'phase_share.p99.' + ph, label: ph, color: '--' + ph })) },
    'chart-errors': {
      unit: '%',
      ratio: true,
      lines: [
        { path: 'error_rate', label: 'errors', color: '--bad' },
        { path: 'cancel_rate', label: 'cancelled', color: '--warn' },
        { path: 'rejection_rate', label: 'rejected', color: '--queue' },
      ],
    },
    'chart-gpu': {
      unit: '%',
      ratio: true,
      gpu: true,
      lines: [
        { path: 'gpu.utilization.prefill', label: 'util prefill', color: '--prefill' },
        { path: 'gpu.utilization.decode', label: 'util decode', color: '--decode' },
        { path: 'gpu.attributed_power', label: 'power (W)', color: '--accent', scale: 'r', dash: [4, 3] },
      ],
      right: { unit: 'W' },
    },
    'chart-energy': {
      unit: 'J',
      gpu: true,
      lines: [{ path: 'gpu.energy_per_output_token', label: 'J / output token', color: '--decode' }],
    },
  };

  // x values and one y array per line, for the selection and range.
  function chartData(spec, live, xmin) {
    const pts = new Map(); // t -> {path: v}
    const firstLive = live.length ? live[0].t : Infinity;
    for (const l of spec.lines) {
      const h = state.history.get(l.path);
      if (!h) continue;
      for (const [t, v] of h) {
        if (t < xmin || t >= firstLive) continue;
        if (!pts.has(t)) pts.set(t, {});
        pts.get(t)[l.path] = num(v);
      }
    }
    for (const p of live) {
      if (p.t < xmin) continue;
      const row = pts.get(p.t) || {};
      for (const l of spec.lines) row[l.path] = p.f ? p.f[l.path] : null;
      pts.set(p.t, row);
    }
    const xs = Array.from(pts.keys()).sort((a, b) => a - b);
    const ys = spec.lines.map((l) => xs.map((t) => {
      const v = pts.get(t)[l.path];
      if (v == null) return null;
      return spec.ratio && l.scale !== 'r' ? v * 100 : spec.stacked ? v * 100 : v;
    }));
    return [xs, ys];
  }

  // ---------------------------------------------------------------- uPlot
  function axisValues(unit) {
    if (unit === 's') return (u, splits) => splits.map((v) => fmtSec(v));
    if (unit === '%') {
      // As many decimals as the step between ticks needs (0.5 % steps must not read 1 %, 1 %).
      return (u, splits) => {
        const step = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : 1;
        const digits = step > 0 && step < 1 ? Math.min(3, Math.ceil(-Math.log10(step))) : 0;
        return splits.map((v) => v.toFixed(digits) + '%');
      };
    }
    return (u, splits) => splits.map((v) => fmtNum(v));
  }
  function legendValue(unit) {
    if (unit === 's') return (u, v) => fmtSec(v);
    if (unit === '%') return (u, v) => fmtPctRaw(v);
    return (u, v) => (v == null ? '–' : fmtNum(v));
  }

  function sloHook(spec) {
    return (u) => {
      const slo = spec.slo && spec.slo();
      if (!(slo > 0)) return;
      const ctx = u.ctx;
      const max = u.scales.y.max;
      const dpr = window.devicePixelRatio || 1;
      ctx.save();
      ctx.fillStyle = css('--slo');
      ctx.font = 11 * dpr + 'px system-ui, sans-serif';
      if (slo <= max) {
        const y = Math.round(u.valToPos(slo, 'y', true));
        ctx.strokeStyle = css('--slo');
        ctx.lineWidth = 1.5 * dpr;
        ctx.setLineDash([6 * dpr, 4 * dpr]);
        ctx.beginPath();
        ctx.moveTo(u.bbox.left, y);
        ctx.lineTo(u.bbox.left + u.bbox.width, y);
        ctx.stroke();
        ctx.textAlign = 'right';
        ctx.fillText('SLO ' + fmtSec(slo), u.bbox.left + u.bbox.width - 4 * dpr, y - 4 * dpr);
      } else {
        ctx.textAlign = 'left';
        ctx.fillText('SLO ' + fmtSec(slo) + ' (above the chart)', u.bbox.left + 6 * dpr, u.bbox.top + 12 * dpr);
      }
      ctx.restore();
    };
  }

  function alpha(color, a) {
    // #rrggbb -> rgba
    const m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(color);
    if (!m) return color;
    return 'rgba(' + parseInt(m[1], 16) + ',' + parseInt(m[2], 16) + ',' + parseInt(m[3], 16) + ',' + a + ')';
  }

  function buildChart(id) {
    const spec = SPECS[id];
    const el = document.getElementById(id);
    const fg = css('--muted');
    const grid = css('--grid');
    const axis = (extra) => Object.assign({ stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 }, font: '11px system-ui, sans-serif' }, extra);
    const unit = spec.stacked ? '%' : spec.unit;
    const series = [{}];
    const bands = [];
    spec.lines.forEach((l, i) => {
      const color = css(l.color);
      const s = {
        label: l.label,
        stroke: color,
        width: 1.6,
        scale: l.scale || 'y',
        value: legendValue(l.scale === 'r' ? spec.right.unit : unit),
      };
      if (l.dash) s.dash = l.dash;
      if (spec.stacked) {
        // cumulative lines; the legend shows each phase's own share
        s.value = (u, v, si, idx) => {
          const raw = idx == null ? null : u._raw && u._raw[si - 1] ? u._raw[si - 1][idx] : null;
          return fmtPctRaw(raw);
        };
        if (i === 0) s.fill = alpha(color, 0.55);
        else bands.push({ series: [i + 1, i], fill: alpha(color, 0.55) });
      }
      series.push(s);
    });
    const scales = {
      x: { time: true, range: () => [state.xmin, state.xmax] },
      y: {
        range: (u, min, max) => {
          if (spec.stacked || spec.ratio) return [0, Math.max(spec.stacked ? 100 : 1, (max || 0) * 1.1)];
          let top = max == null ? 1 : max;
          const slo = spec.slo && spec.slo();
          if (slo > 0 && slo <= 3 * top) top = Math.max(top, slo);
          return [0, top > 0 ? top * 1.12 : 1];
        },
      },
    };
    const axes = [axis({ space: 60 }), axis({ values: axisValues(unit), size: 64 })];
    if (spec.right) {
      scales.r = { range: (u, min, max) => [0, max > 0 ? max * 1.12 : 1] };
      axes.push(axis({ scale: 'r', side: 1, values: axisValues(spec.right.unit), size: 56, grid: { show: false } }));
    }
    const opts = {
      width: Math.max(200, el.clientWidth),
      height: 170,
      series,
      bands,
      scales,
      axes,
      legend: { live: true },
      cursor: { drag: { x: false, y: false }, points: { size: 5 } },
      hooks: spec.slo ? { draw: [sloHook(spec)] } : {},
    };
    const old = state.charts.get(id);
    if (old) old.u.destroy();
    el.textContent = '';
    const u = new uPlot(opts, [[]].concat(spec.lines.map(() => [])), el);
    state.charts.set(id, { u, spec });
  }

  function updateChart(id, live) {
    const c = state.charts.get(id);
    if (!c) return;
    const { u, spec } = c;
    const [xs, ys] = chartData(spec, live, state.xmin);
    let data = ys;
    if (spec.stacked) {
      u._raw = ys;
      data = [];
      let acc = xs.map(() => 0);
      for (const y of ys) {
        acc = acc.map((a, i) => (y[i] == null || a == null ? null : a + y[i]));
        data.push(acc.slice());
      }
    }
    u.setData([xs].concat(data));
    // Off the plot, the legend shows the latest values (uPlot shows them under the cursor).
    if (xs.length) {
      const showLatest = () => {
        if (!(u.cursor.left >= 0) && u.data[0].length) u.setLegend({ idx: u.data[0].length - 1 });
      };
      showLatest();
      requestAnimationFrame(showLatest); // a chart just built settles its cursor first
    }
    const el = document.getElementById(id);
    let points = 0;
    let last = null;
    ys.forEach((y, li) => {
      for (let i = 0; i < y.length; i++) if (y[i] != null) {
        points++;
        if (li === 0) last = y[i];
      }
    });
    el.dataset.points = String(points);
    el.dataset.xMin = String(state.xmin);
    el.dataset.xMax = String(state.xmax);
    el.dataset.range = String(state.range);
    el.dataset.last = last == null ? '' : String(last);
    if (spec.gpu) {
      const card = el.closest('.card');
      const empty = card.querySelector('.empty');
      const has = points > 0;
      empty.hidden = has;
      el.style.visibility = has ? 'visible' : 'hidden';
      el.style.height = has ? '' : '0';
    }
  }

  function rebuildCharts() {
    for (const id of Object.keys(SPECS)) buildChart(id);
    render();
  }

  // ---------------------------------------------------------------- API
  // When the collector requires a token (401, or 403 for a token without the `read` scope), the
  // page shows a small form, keeps the token in sessionStorage (this tab only, gone when it
  // closes) and sends it as `Authorization: Bearer`. Concurrent requests wait on one prompt.
  const TOKEN_KEY = 'infertrace.token';
  let tokenPrompt = null;
  function storedToken() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (e) { return ''; }
  }
  function askToken(why) {
    if (tokenPrompt) return tokenPrompt;
    tokenPrompt = new Promise((resolve) => {
      const form = $('#auth');
      const input = $('#auth-token');
      $('#auth-why').textContent = why;
      form.hidden = false;
      input.value = '';
      input.focus();
      form.onsubmit = (ev) => {
        ev.preventDefault();
        const token = input.value.trim();
        if (!token) return;
        try { sessionStorage.setItem(TOKEN_KEY, token); } catch (e) { /* private mode: memory only */ }
        state.token = token;
        form.hidden = true;
        form.onsubmit = null;
        tokenPrompt = null;
        resolve(token);
      };
    });
    return tokenPrompt;
  }
  async function getJson(url) {
    let r;
    for (;;) {
      const token = state.token || storedToken();
      const headers = { Accept: 'application/json' };
      if (token) headers.Authorization = 'Bearer ' + token;
      r = await fetch(url, { headers, cache: 'no-store' });
      if (r.status !== 401 && r.status !== 403) break;
      const why = r.status === 403 ? 'this token lacks the read scope'
        : token ? 'the collector did not accept this token' : 'the collector asks for a token';
      state.token = '';
      try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* ignore */ }
      await askToken(why);
    }
    if (!r.ok) {
      let msg = r.status + ' ' + r.statusText;
      try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
      throw new Error(url.split('?')[0] + ': ' + msg);
    }
    return r.json();
  }

  // The configured KPI window that best summarises the range (largest not above it).
  function windowFor(range) {
    const ws = state.settings.windows_seconds.slice().sort((a, b) => a - b);
    let w = ws[0] || 60;
    for (const x of ws) if (x <= range) w = x;
    return w;
  }
  const liveWindow = () => (state.settings.windows_seconds.slice().sort((a, b) => a - b)[0] || 60);

  async function poll() {
    const w = fmtWindow(liveWindow());
    try {
      const snap = await getJson('/api/kpis?window=' + w);
      const t = Date.now() / 1000;
      const rows = (snap.series || []).map((s) => ({ service: s.service, model: s.model, operation: s.operation, flat: flatten(s, snap.window_seconds) }));
      state.polls.push({ t, rows });
      if (state.polls.length > MAX_POLLS) state.polls.splice(0, state.polls.length - MAX_POLLS);
      state.latest = snap;
      state.pollCount++;
      // The pickers list what the selected range holds: once the live window is empty (load
      // stopped a minute ago) the larger windows still have the models and services.
      let listed = snap.series || [];
      const rangeWindow = windowFor(state.range);
      if (!listed.length && rangeWindow !== liveWindow()) {
        listed = (await getJson('/api/kpis?window=' + fmtWindow(rangeWindow))).series || [];
      }
      updateSelectors(listed);
      await Promise.all([refreshHistory(false), refreshPanels()]);
      state.lastError = '';
      state.lastOkAt = Date.now();
    } catch (e) {
      state.lastError = e.message || String(e);
    }
    render();
  }

  async function refreshHistory(force) {
    if (!state.settings.history) return;
    const key = state.model + '|' + state.service + '|' + state.range;
    const now = Date.now();
    if (!force && key === state.historyKey && now - state.historyAt < HISTORY_REFRESH_MS) return;
    state.historyKey = key;
    state.historyAt = now;
    const to = Math.floor(now / 1000);
    const from = to - state.range;
    const step = Math.max(60, Math.ceil(state.range / 360 / 60) * 60);
    const paths = new Set();
    for (const spec of Object.values(SPECS)) for (const l of spec.lines) if (!CLIENT_ONLY.has(l.path)) paths.add(l.path);
    const next = new Map();
    await Promise.all(Array.from(paths).map(async (kpi) => {
      const q = new URLSearchParams({ kpi, from: String(from), to: String(to), step: String(step) });
      if (state.service) q.set('service', state.service);
      if (state.model) q.set('model', state.model);
      try {
        const h = await getJson('/api/history?' + q);
        // [[unix_seconds, value|null], ...]; {t_unix_nano, value} objects are read too.
        const pts = (h.points || []).map((p) => (Array.isArray(p) ? p : p && typeof p === 'object' ? [p.t_unix_nano / 1e9, p.value] : null));
        next.set(kpi, pts.filter((p) => p && p.length === 2 && typeof p[0] === 'number'));
      } catch (e) { /* this KPI has no history: the live points still show */ }
    }));
    if (key === state.historyKey) state.history = next;
  }

  async function refreshPanels() {
    const w = fmtWindow(windowFor(state.range));
    const sel = new URLSearchParams({ limit: '50', sort: 'slowest', service: state.service, model: state.model });
    const [cp, findings, alerts, traces] = await Promise.all([
      getJson('/api/critical-path?window=' + w),
      getJson('/api/findings?window=' + w),
      getJson('/api/alerts'),
      getJson('/api/traces?' + sel),
    ]);
    renderCritical(cp, w);
    // The critical path counts the window's requests; findings say none of their own.
    renderFindings(findings, w, cp.requests);
    renderAlerts(alerts);
    renderSlow(traces);
  }

  // ---------------------------------------------------------------- selectors
  function updateSelectors(series) {
    const models = new Map();
    for (const s of series) models.set(s.model, (models.get(s.model) || 0) + s.requests);
    for (const p of state.polls) for (const r of p.rows) if (!models.has(r.model)) models.set(r.model, 0);
    if (!state.model && models.size) {
      state.model = Array.from(models.entries()).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))[0][0];
      saveHash();
    }
    fillSelect($('#model'), Array.from(models.keys()).sort(), state.model, null);
    const services = new Set();
    for (const s of series) if (!state.model || s.model === state.model) services.add(s.service);
    for (const p of state.polls) for (const r of p.rows) if (!state.model || r.model === state.model) services.add(r.service);
    fillSelect($('#service'), Array.from(services).sort(), state.service, 'all services');
  }

  function fillSelect(el, values, current, allLabel) {
    const want = (allLabel ? [''] : []).concat(values);
    if (current && !want.includes(current)) want.push(current);
    const have = Array.from(el.options).map((o) => o.value);
    // Compared item by item: joined, [] and [''] would read the same (no "all" option ever).
    if (have.length !== want.length || have.some((v, i) => v !== want[i])) {
      el.textContent = '';
      for (const v of want) {
        const o = document.createElement('option');
        o.value = v;
        o.textContent = v === '' ? allLabel || '—' : v;
        el.appendChild(o);
      }
    }
    el.value = current;
  }

  function saveHash() {
    const q = new URLSearchParams({ model: state.model, service: state.service, range: String(state.range) });
    history.replaceState(null, '', '#' + q);
  }
  function loadHash() {
    const q = new URLSearchParams(location.hash.slice(1));
    if (q.get('model')) state.model = q.get('model');
    if (q.get('service')) state.service = q.get('service');
    const r = Number(q.get('range'));
    if ([900, 3600, 21600, 86400, 604800].includes(r)) state.range = r;
  }

  async function selectionChanged() {
    saveHash();
    state.selectedTrace = null;
    $('#waterfall').hidden = true;
    render();
    try {
      await Promise.all([refreshHistory(true), refreshPanels()]);
      state.lastError = '';
    } catch (e) {
      state.lastError = e.message || String(e);
    }
    render();
  }

  // ---------------------------------------------------------------- rendering
  function render() {
    const now = Date.now() / 1000;
    state.xmax = now;
    state.xmin = now - state.range;
    // Without history for most of the range (a fresh collector, no store), the x axis starts
    // where the data does, so a few minutes of live points are not a sliver at the right edge.
    let first = Infinity;
    for (const h of state.history.values()) for (const p of h) if (p[1] != null && p[0] >= state.xmin) { first = Math.min(first, p[0]); break; }
    for (const p of state.polls) if (p.t >= state.xmin) { first = Math.min(first, p.t); break; }
    state.zoomed = isFinite(first) && first > state.xmin + state.range / 2;
    if (state.zoomed) state.xmin = Math.max(state.xmin, first - Math.max(15, (now - first) * 0.05));
    for (const b of document.querySelectorAll('#ranges button')) b.setAttribute('aria-pressed', String(Number(b.dataset.range) === state.range));
    const live = liveSeries();
    for (const id of state.charts.keys()) updateChart(id, live);
    renderTiles(live.length ? live[live.length - 1].f : null);
    renderPd(state.latest);
    const st = $('#status');
    // Figures that no longer update are said to be old and dimmed, not shown as live.
    document.body.classList.toggle('stale', Boolean(state.lastError) && state.pollCount > 0);
    if (state.lastError) {
      st.className = 'status down';
      st.textContent = 'not updating: ' + state.lastError +
        (state.lastOkAt ? ' · the figures below are from ' + new Date(state.lastOkAt).toLocaleTimeString() : '');
    } else if (state.pollCount > 0) {
      st.className = 'status live';
      st.textContent = 'live · ' + new Date().toLocaleTimeString() + ' · every ' + state.settings.poll_interval_ms / 1000 + ' s · figures over the last ' + fmtWindow(liveWindow()) +
        (state.zoomed ? ' · data since ' + new Date((state.xmin + 15) * 1000).toLocaleTimeString() : '');
    }
    document.body.dataset.polls = String(state.pollCount);
    document.body.dataset.model = state.model;
    document.body.dataset.service = state.service;
    document.body.dataset.range = String(state.range);
  }

  function renderTiles(f) {
    const w = fmtWindow(liveWindow());
    const slo = state.settings.slo;
    const v = (k) => (f ? f[k] : null);
    const tiles = [
      ['requests/s', fmtNum(v('throughput.requests_per_second')), ''],
      ['output tokens/s', fmtNum(v('throughput.output_tokens_per_second')), ''],
      ['goodput', fmtPct(v('goodput.ratio')), v('goodput.ratio') == null ? '' : v('goodput.ratio') < 0.9 ? 'bad' : 'good'],
      ['e2e p99', fmtSec(v('e2e.p99')), v('e2e.p99') > slo.e2e_seconds ? 'bad' : ''],
      ['TTFT p99', fmtSec(v('ttft.p99')), v('ttft.p99') > slo.ttft_seconds ? 'bad' : ''],
      ['TPOT p99', fmtSec(v('tpot.p99')), v('tpot.p99') > slo.tpot_seconds ? 'bad' : ''],
      ['error rate', fmtPct(v('error_rate')), v('error_rate') > 0.01 ? 'bad' : ''],
      ['GPU util (decode)', fmtPct(v('gpu.utilization.decode')), ''],
    ];
    $('#tiles').innerHTML = tiles.map(([k, val, cls], i) => '<div class="tile" data-tile="' + i + '" title="' + esc(k + ' over the last ' + w) + '"><div class="k">' + esc(k) + '</div><div class="v ' + cls + '">' + esc(val) + '</div></div>').join('');
    const e2e = $('#tiles [data-tile="3"] .v');
    if (e2e) e2e.dataset.value = v('e2e.p99') == null ? '' : String(v('e2e.p99'));
  }

  function renderCritical(cp, w) {
    const el = $('#critical');
    // The critical path is aggregated per (service, span), not per model: say whose it is.
    const whose = state.service ? 'all models; rows of ' + state.service + ' only' : 'all models and services';
    $('#critical-window').textContent = 'last ' + w + ' · ' + (cp.requests || 0) + ' requests (' + whose + ') · share of their summed e2e on the critical path';
    let entries = (cp.entries || []).slice();
    if (state.service) entries = entries.filter((e) => e.service === state.service);
    entries.sort((a, b) => (b.share.all || 0) - (a.share.all || 0));
    const more = Math.max(0, entries.length - 12);
    entries = entries.slice(0, 12);
    el.dataset.points = String(entries.length);
    if (!entries.length) {
      el.innerHTML = '<p class="none">No request completed in the last ' + esc(w) + '.</p>';
      return;
    }
    const bar = (cls, v, secs) => '<div class="track" title="' + esc(fmtPct(v) + ' · ' + fmtSec(secs) + ' on the critical path') + '"><div class="fill ' + cls + '" data-css="width:' + Math.min(100, Math.max(0, (v || 0) * 100)).toFixed(2) + '%"></div><span class="pct">' + fmtPct(v) + '</span></div>';
    el.innerHTML = entries.map((e) => '<div class="name" title="' + esc(e.span + ' · ' + e.service) + '">' + esc(e.span) + ' <small>' + esc(e.service) + '</small></div><div class="pair">' + bar('all', e.share.all, e.seconds.all) + bar('p99', e.share.p99, e.seconds.p99) + '</div>').join('') +
      (more ? '<p class="none more">' + more + ' more with smaller shares (all of them: /api/critical-path)</p>' : '');
    applyCss(el);
  }

  // Disaggregated prefill/decode: the sub-phases along time to first token of the selection's
  // series with the most disaggregated requests (`disagg` of /api/kpis), each with its share of
  // TTFT and its p50, grouped by pool; and each worker's requests and sub-phases. Hidden while
  // no selected series has disaggregated requests.
  const PD_ALONG_TTFT = ['routing', 'bootstrap', 'prefill_queue', 'prefill', 'kv_transfer', 'decode_wait', 'first_token'];
  function renderPd(snap) {
    const el = $('#pd');
    const series = ((snap && snap.series) || []).filter((s) => s.disagg && matches(s));
    series.sort((a, b) => (b.disagg.requests || 0) - (a.disagg.requests || 0));
    const s = series[0];
    $('#pd-section').hidden = !s;
    if (!s) {
      el.dataset.points = '0';
      el.innerHTML = '';
      $('#pd-workers tbody').innerHTML = '';
      return;
    }
    const d = s.disagg;
    const rows = [];
    for (const p of d.pools || []) for (const sp of p.sub_phases || []) if (PD_ALONG_TTFT.includes(sp.name)) rows.push({ pool: p.pool, sp });
    rows.sort((a, b) => PD_ALONG_TTFT.indexOf(a.sp.name) - PD_ALONG_TTFT.indexOf(b.sp.name));
    $('#pd-window').textContent = 'last ' + fmtWindow(liveWindow()) + ' · ' + s.service + ' · ' + d.requests + ' requests' + (d.ttft ? ' · TTFT p50 ' + fmtSec(d.ttft.p50) + ', p90 ' + fmtSec(d.ttft.p90) : '');
    el.dataset.points = String(rows.length);
    const bar = (v, lat) => '<div class="track" title="' + esc(fmtPct(v) + ' of TTFT · p50 ' + fmtSec(lat.p50) + ' · p90 ' + fmtSec(lat.p90)) + '"><div class="fill all" data-css="width:' + Math.min(100, Math.max(0, (v || 0) * 100)).toFixed(2) + '%"></div><span class="pct">' + esc(fmtPct(v) + ' · ' + fmtSec(lat.p50)) + '</span></div>';
    el.innerHTML = rows.map((r) => '<div class="name" data-phase="' + esc(r.sp.name) + '" data-share="' + esc(r.sp.ttft_share == null ? '' : String(r.sp.ttft_share)) + '" title="' + esc(r.sp.name + ' · ' + r.pool) + '">' + esc(r.sp.name) + ' <small>' + esc(r.pool) + '</small></div><div class="pair">' + bar(r.sp.ttft_share, r.sp.latency) + '</div>').join('');
    applyCss(el);
    const workers = d.workers || [];
    $('#pd-workers').dataset.points = String(workers.length);
    $('#pd-workers tbody').innerHTML = workers.map((w) => '<tr data-worker="' + esc(w.worker) + '"><td>' + esc(w.worker) + '</td><td>' + esc(w.pool) + '</td><td class="num">' + esc(String(w.requests)) + '</td><td>' + esc((w.sub_phases || []).map((sp) => sp.name + ' ' + fmtSec(sp.latency.p50)).join(' · ')) + '</td><td class="num">' + esc(w.kv_transfer_tokens_per_second == null ? '' : fmtNum(w.kv_transfer_tokens_per_second)) + '</td></tr>').join('');
  }

  function renderSlow(list) {
    const body = $('#slow tbody');
    const rows = list.traces || [];
    $('#slow').dataset.points = String(rows.length);
    if (!rows.length) {
      body.innerHTML = '<tr><td colspan="7" class="none">No recent request for this selection.</td></tr>';
      return;
    }
    body.innerHTML = rows.map((t) => '<tr data-trace-id="' + esc(t.trace_id) + '"' + (t.trace_id === state.selectedTrace ? ' class="selected"' : '') + '><td><code>' + esc(t.trace_id.slice(0, 12)) + '…</code></td><td>' + esc(t.service) + '</td><td class="num">' + fmtSec(t.e2e) + '</td><td class="num">' + fmtSec(t.ttft) + '</td><td class="num">' + fmtSec(t.tpot) + '</td><td><span class="outcome ' + esc(t.outcome) + '">' + esc(t.outcome) + '</span></td><td>' + esc(fmtTime(t.start_unix_nano)) + '</td></tr>').join('');
  }

  function renderFindings(data, w, requests) {
    const el = $('#findings');
    $('#findings-window').textContent = 'last ' + w;
    const fs = (data.findings || []).filter(matches);
    // Series under the rules' minimum of requests were not judged: their silence is no health.
    const quiet = (data.undiagnosed || []).filter(matches);
    const quietNote = quiet.length
      ? '<p class="none undiagnosed">Not diagnosed (fewer than ' + esc(String(data.min_requests)) + ' requests in the last ' + esc(w) + ', too few to judge): ' + esc(quiet.map((q) => [q.service, q.model, q.operation].filter(Boolean).join(' · ') + ' (' + q.requests + ')').join(', ')) + '</p>'
      : '';
    el.dataset.points = String(fs.length);
    if (!fs.length) {
      el.innerHTML = requests === 0
        ? '<p class="none">No inference requests in the last ' + esc(w) + ' yet: nothing to judge.</p>'
        : quiet.length
          ? quietNote
          : '<p class="none">No finding for this selection: nothing stands out.</p>';
      return;
    }
    const order = { critical: 0, warning: 1, info: 2 };
    fs.sort((a, b) => (order[a.severity] - order[b.severity]));
    el.innerHTML = quietNote + fs.map((f) => '<div class="finding ' + esc(f.severity) + '"><div class="t"><span class="chip ' + esc(f.severity) + '">' + esc(f.severity) + '</span>' + esc(f.title) + '</div><div class="s">' + esc([f.service, f.model, f.operation].filter(Boolean).join(' · ')) + ' · ' + esc(f.rule_id) + '</div><ul>' + (f.evidence || []).map((e) => '<li>' + esc(e.metric) + ' = ' + esc(fmtUnit(e.value, e.unit)) + (e.threshold != null ? ' (threshold ' + esc(fmtUnit(e.threshold, e.unit)) + ')' : '') + '</li>').join('') + '</ul><div class="rec">→ ' + esc(f.recommendation) + '</div></div>').join('');
  }

  function fmtUnit(v, unit) {
    if (unit === 's') return fmtSec(v);
    if (unit === 'ratio' || unit === '1') return fmtPct(v);
    if (unit === 'x') return (Number.isFinite(v) ? v.toFixed(1) : '-') + '×';
    if (unit === '1/s') return fmtNum(v) + '/s';
    return fmtNum(v) + (unit ? ' ' + unit : '');
  }

  function renderAlerts(view) {
    const el = $('#alerts');
    // Every alert shows (one for another model matters too); the selection's come first.
    const mine = (a) => (!state.model || a.model === state.model) && (!state.service || a.service === state.service);
    const first = (list) => list.filter(mine).concat(list.filter((a) => !mine(a)));
    const active = first(view.active || []);
    const resolved = first((view.resolved || []).slice(-10).reverse());
    const anomalies = first(view.anomalies || []);
    el.dataset.points = String(active.length + resolved.length + anomalies.length);
    const series = (a) => [a.service, a.model, a.operation].filter(Boolean).join(' · ');
    const parts = [];
    for (const a of active) parts.push('<div class="alert ' + esc(a.state) + '"><div class="t"><span class="chip ' + esc(a.state) + '">' + esc(a.state) + '</span>' + esc(a.alert) + '</div><div class="s">' + esc(series(a)) + ' · <code>' + esc(a.expr) + '</code> · value ' + esc(fmtNum(a.value, 3)) + ' · since ' + esc(fmtTime(a.active_since_unix_nano)) + '</div></div>');
    for (const a of anomalies) parts.push('<div class="alert pending"><div class="t"><span class="chip pending">anomaly</span>' + esc(a.kpi) + ' ' + esc(a.direction) + '</div><div class="s">' + esc(series(a)) + ' · value ' + esc(fmtNum(a.value, 3)) + ' vs baseline ' + esc(fmtNum(a.baseline, 3)) + ' (' + esc(fmtNum(a.deviation_sigmas, 1)) + ' σ)</div></div>');
    for (const a of resolved) parts.push('<div class="alert resolved"><div class="t"><span class="chip resolved">resolved</span>' + esc(a.alert) + '</div><div class="s">' + esc(series(a)) + ' · <code>' + esc(a.expr) + '</code>' + (a.resolved_at_unix_nano ? ' · at ' + esc(fmtTime(a.resolved_at_unix_nano)) : '') + '</div></div>');
    const rules = (view.rules || []).length;
    if (!parts.length) parts.push('<p class="none">No active alert. ' + rules + ' rule' + (rules === 1 ? '' : 's') + ' configured' + (view.evaluated_at_unix_nano ? ', last evaluated ' + esc(fmtTime(view.evaluated_at_unix_nano)) : '') + '.</p>');
    else parts.push('<p class="none">' + rules + ' rule' + (rules === 1 ? '' : 's') + ' configured.</p>');
    el.innerHTML = parts.join('');
  }

  // ---------------------------------------------------------------- waterfall
  function attr(span, key) {
    for (const kv of span.attributes || []) {
      if (Array.isArray(kv) && kv[0] === key) return kv[1];
      if (kv && kv.key === key) return kv.value;
    }
    return undefined;
  }

  async function openTrace(id) {
    state.selectedTrace = id;
    for (const tr of document.querySelectorAll('#slow tbody tr')) tr.classList.toggle('selected', tr.dataset.traceId === id);
    const wf = $('#waterfall');
    try {
      const t = await getJson('/api/traces/' + encodeURIComponent(id));
      renderWaterfall(t);
      wf.hidden = false;
      wf.scrollIntoView({ block: 'nearest' });
    } catch (e) {
      state.lastError = e.message || String(e);
      render();
    }
  }

  function renderWaterfall(t) {
    const spans = (t.spans || []).slice();
    const req = (t.requests || [])[0];
    const rec = req ? req.record : null;
    const segs = req && req.critical_path ? req.critical_path.segments || [] : [];
    $('#waterfall-id').textContent = t.trace_id;
    $('#waterfall-summary').textContent = rec
      ? [rec.service, rec.model, rec.outcome, 'e2e ' + fmtSec(rec.e2e), 'TTFT ' + fmtSec(rec.ttft), 'TPOT ' + fmtSec(rec.tpot), (rec.output_tokens != null ? rec.output_tokens + ' output tokens' : ''), rec.gpu && rec.gpu.energy_attributed_joules != null ? fmtNum(rec.gpu.energy_attributed_joules) + ' J attributed' : ''].filter(Boolean).join(' · ')
      : '';
    // tree order: parents before children, children by start
    const byId = new Map(spans.map((s) => [s.span_id, s]));
    const kids = new Map();
    const roots = [];
    for (const s of spans) {
      if (s.parent_span_id && byId.has(s.parent_span_id)) {
        if (!kids.has(s.parent_span_id)) kids.set(s.parent_span_id, []);
        kids.get(s.parent_span_id).push(s);
      } else roots.push(s);
    }
    const order = [];
    const walk = (s, depth) => {
      order.push([s, depth]);
      (kids.get(s.span_id) || []).sort((a, b) => a.start_unix_nano - b.start_unix_nano).forEach((c) => walk(c, depth + 1));
    };
    roots.sort((a, b) => a.start_unix_nano - b.start_unix_nano).forEach((r) => walk(r, 0));
    const t0 = Math.min.apply(null, spans.map((s) => s.start_unix_nano));
    const t1 = Math.max.apply(null, spans.map((s) => s.end_unix_nano));
    const total = Math.max(1, t1 - t0);
    const pos = (ns) => (((ns - t0) / total) * 100).toFixed(3) + '%';
    const wid = (a, b) => ((Math.max(0, b - a) / total) * 100).toFixed(3) + '%';
    let crit = 0;
    const rows = order.map(([s, depth]) => {
      const mine = segs.filter((g) => g.span_id === s.span_id);
      crit += mine.length;
      const critSecs = mine.reduce((a, g) => a + (g.end_unix_nano - g.start_unix_nano), 0) / 1e9;
      const gpu = [];
      const util = attr(s, 'gpu.utilization.mean');
      const power = attr(s, 'gpu.power.mean');
      const energy = attr(s, 'gpu.energy.attributed');
      if (typeof util === 'number') gpu.push('GPU ' + fmtPct(util));
      if (typeof power === 'number') gpu.push(fmtNum(power, 0) + ' W');
      if (typeof energy === 'number') gpu.push(fmtNum(energy) + ' J');
      const dur = (s.end_unix_nano - s.start_unix_nano) / 1e9;
      const info = [fmtSec(dur)].concat(mine.length ? ['critical ' + fmtSec(critSecs)] : []).concat(gpu).join(' · ');
      return '<div class="label" data-css="padding-left:' + depth * 14 + 'px" title="' + esc(s.name + ' · ' + s.service) + '">' + esc(s.name) + ' <small class="none">' + esc(s.service) + '</small></div>' +
        '<div class="lane" data-span-id="' + esc(s.span_id) + '"><div class="spanbar" data-css="left:' + pos(s.start_unix_nano) + ';width:' + wid(s.start_unix_nano, s.end_unix_nano) + '"></div>' +
        mine.map((g) => '<div class="critbar" data-critical="1" title="critical ' + esc(fmtSec((g.end_unix_nano - g.start_unix_nano) / 1e9)) + '" data-css="left:' + pos(g.start_unix_nano) + ';width:' + wid(g.start_unix_nano, g.end_unix_nano) + '"></div>').join('') + '</div>' +
        '<div class="attrs" title="' + esc(info) + '">' + esc(info) + '</div>';
    });
    rows.push('<div></div><div class="axis"><span>0</span><span>' + fmtSec(total / 2e9) + '</span><span>' + fmtSec(total / 1e9) + '</span></div><div></div>');
    const el = $('#waterfall-rows');
    el.innerHTML = rows.join('');
    applyCss(el);
    el.dataset.spans = String(order.length);
    el.dataset.criticalSegments = String(crit);
    el.dataset.traceId = t.trace_id;
  }

  // ---------------------------------------------------------------- start
  function wire() {
    $('#model').addEventListener('change', (e) => {
      state.model = e.target.value;
      state.service = '';
      updateSelectors(state.latest ? state.latest.series || [] : []);
      selectionChanged();
    });
    $('#service').addEventListener('change', (e) => {
      state.service = e.target.value;
      selectionChanged();
    });
    for (const b of document.querySelectorAll('#ranges button')) {
      b.addEventListener('click', () => {
        state.range = Number(b.dataset.range);
        selectionChanged();
      });
    }
    $('#slow tbody').addEventListener('click', (e) => {
      const tr = e.target.closest('tr[data-trace-id]');
      if (tr) openTrace(tr.dataset.traceId);
    });
    $('#waterfall-close').addEventListener('click', () => {
      state.selectedTrace = null;
      $('#waterfall').hidden = true;
      for (const tr of document.querySelectorAll('#slow tbody tr')) tr.classList.remove('selected');
    });
    const mq = window.matchMedia('(prefers-color-scheme: dark)');
    const onScheme = () => rebuildCharts();
    if (mq.addEventListener) mq.addEventListener('change', onScheme);
    if (window.ResizeObserver) {
      const ro = new ResizeObserver((entries) => {
        for (const en of entries) {
          const c = state.charts.get(en.target.id);
          const w = Math.floor(en.contentRect.width);
          if (c && w > 0 && Math.abs(c.u.width - w) > 1) c.u.setSize({ width: w, height: 170 });
        }
      });
      for (const id of Object.keys(SPECS)) ro.observe(document.getElementById(id));
    }
  }

  async function start() {
    loadHash();
    wire();
    try {
      const s = await getJson('/api/dashboard');
      state.settings = Object.assign(state.settings, s);
    } catch (e) {
      state.lastError = 'settings: ' + (e.message || e);
    }
    rebuildCharts();
    await poll();
    document.body.dataset.ready = '1';
    const loop = async () => {
      await poll();
      state.timer = setTimeout(loop, state.settings.poll_interval_ms);
    };
    state.timer = setTimeout(loop, state.settings.poll_interval_ms);
  }

  // Exposed for debugging from the console and for the browser test.
  window.infertraceDashboard = { state, poll, render, openTrace };
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();

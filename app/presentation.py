"""Presentation mode's page layout: no sidebar, no header, no banners or text between the charts,
one chart per screen. Each chart keeps the slide size the figures' template lays it out at
(app/figures/_slide.py: 1280 x 720, 16:9, the same as a slide-mode PNG export) and is scaled as a
whole to fit the window, so what the room sees is what the export writes. Errors, warnings and
the page's own controls (step buttons, sliders) stay, stepping controls in a bar at the bottom of
the window (a container keyed STEP_BAR...), a page's folded controls (an expander keyed slide_controls)
in a faint pill top left; download buttons, export menus and the switches that draw more charts fade until hovered.
The keyboard steps through the charts one slide at a time: PageDown / → next, PageUp / ← previous;
past a page's last slide it opens the next page in the sidebar's order (settings.PAGES) at its first
slide, before its first the previous page at its last; a faint label at the top says where you are
("Tile schedule · slide 2 / 4"). Every slide after the first starts a pill band below what comes
before it, so the previous slide's menus never show under the fixed pills, and a slide is scaled so
its chart and every menu under it (export, video) fit the window.
"""

from __future__ import annotations

import json

import streamlit as st

STEP_BAR = "slide_step_bar"     # key prefix of a container of stepping controls: on slides, a bar at the bottom

CSS = """
<style>
[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"],
[data-testid="stExpandSidebarButton"], [data-testid="stHeader"], [data-testid="stDecoration"] {
  display: none !important;
}
/* the first slide starts below the fixed Controls pill and Leave button (TOP_PX), as every slide
   the keyboard brings up does: neither covers a chart's title */
[data-testid="stMainBlockContainer"] { max-width: none; padding: 2.7rem 1rem 2rem; }
/* banners and the words between charts: a slide is the chart (errors and warnings stay). Only on
   the page: an open menu (a popover, drawn outside stMain) keeps its words, e.g. the video menu's
   "120 video frames (15 s at 8 fps) ..., about 0.75 s per frame" */
[data-testid="stMain"] [data-testid="stElementContainer"]:has([data-testid="stAlertContentInfo"]),
[data-testid="stMain"] [data-testid="stElementContainer"]:has([data-testid="stAlertContentSuccess"]),
[data-testid="stMain"] [data-testid="stElementContainer"]:has(> [data-testid="stMetric"]),
[data-testid="stMain"] [data-testid="stElementContainer"]:has(> [data-testid="stHeading"]),
[data-testid="stMain"] [data-testid="stElementContainer"]:has(> [data-testid="stCaptionContainer"]),
[data-testid="stMain"] [data-testid="stElementContainer"]:has(> [data-testid="stMarkdown"]),
[data-testid="stMain"] [data-testid="stExpander"], [data-testid="stMain"] [data-testid="stDataFrame"] {
  display: none !important; }
/* and their stand-ins: until an element's code has loaded (st.metric, st.dataframe, a button: lazy
   chunks) Streamlit draws a 40 px skeleton in its place. The rules above hide the element, not the
   skeleton, so a slide under a hidden metric row (Your model, Model run) sat 40 px + the 16 px gap
   low until the chunk came, seconds on a loaded machine: its export row fell below a 720 px window */
[data-testid="stMain"] [data-testid="stElementContainer"]:has(> [data-testid="stSkeleton"]) {
  display: none !important; }
/* except the page's controls folded into an expander keyed slide_controls (schedule page): a faint
   pill in the top-left corner, out of the chart's way, opened over the slide when needed */
.st-key-slide_controls [data-testid="stExpander"] { display: block !important; }
.st-key-slide_controls { position: fixed; top: 0.6rem; left: 1rem; z-index: 1000;
  width: auto !important; max-width: calc(100vw - 14rem); opacity: 0.3; transition: opacity 0.2s; }
.st-key-slide_controls:hover, .st-key-slide_controls:has(details[open]) { opacity: 1; }
.st-key-slide_controls:has(details[open]) { width: min(64rem, calc(100vw - 14rem)) !important; background: #fff; }
/* one chart per screen, at its own 16:9 slide size, scaled to the window (script below) */
[data-testid="stElementContainer"]:has([data-testid="stPlotlyChart"]) {
  margin: calc((100vh - 4.5rem) * 0.02) 0;
}
[data-testid="stPlotlyChart"] { width: auto !important; }
/* nothing is drawn over a slide when the pointer comes to it (Plotly's mode bar, Streamlit's
   element toolbar with its shadow): the room sees the chart as exported */
[data-testid="stMain"] .js-plotly-plot .modebar-container, [data-testid="stMain"] [data-testid="stElementToolbar"] {
  display: none !important; }
/* buttons and menus under a chart stay above it: the scaled chart keeps its unscaled layout box,
   pulled up by a negative margin, and its positioned layers would otherwise paint over them. The
   fade below made it worse: at full opacity (hover) an element loses its stacking context and
   falls under the chart, so the mouse-down of a click landed on the chart and the menu never
   opened (Enter did). Positioned with a z-index they stay on top whatever their opacity. */
[data-testid="stDownloadButton"], [data-testid="stPopover"], [class*="st-key-slide_step_bar"] button {
  position: relative; z-index: 5; }
[data-testid="stDownloadButton"], [data-testid="stPopover"] { opacity: 0.25; }
[data-testid="stDownloadButton"]:hover, [data-testid="stPopover"]:hover { opacity: 1; }
[data-testid="stPopoverBody"] [data-testid="stDownloadButton"] { opacity: 1; }   /* an open menu reads whole */
/* the page's switches for more charts ("Draw the animation") fade too: the presenter finds them,
   the room sees the chart (the step bar's controls stay whole) */
[data-testid="stMainBlockContainer"] [data-testid="stElementContainer"]:has(> [data-testid="stCheckbox"]) {
  opacity: 0.3; transition: opacity 0.2s; }
[data-testid="stMainBlockContainer"] [data-testid="stElementContainer"]:has(> [data-testid="stCheckbox"]):hover,
[data-testid="stMainBlockContainer"] [class*="st-key-slide_step_bar"] [data-testid="stElementContainer"]:has(> [data-testid="stCheckbox"]),
[data-testid="stMainBlockContainer"] .st-key-slide_controls [data-testid="stElementContainer"]:has(> [data-testid="stCheckbox"]) {
  opacity: 1; }
/* the way out: a clear dark pill in the top-right corner, small enough to stay out of the slide */
.st-key-leave_present { position: fixed; top: 0.6rem; right: 1rem; z-index: 1000; width: auto !important;
  opacity: 0.45; transition: opacity 0.2s; }   /* faint over a chart's title until the pointer comes */
.st-key-leave_present:hover { opacity: 1; }
.st-key-leave_present button { background: rgba(30, 30, 40, 0.82); color: #fff; border: 1px solid #fff;
  border-radius: 1.2rem; padding: 0.3rem 0.9rem; min-height: 0; font-size: 0.95rem; font-weight: 600;
  box-shadow: 0 1px 4px rgba(0, 0, 0, 0.35); }
.st-key-leave_present button:hover { background: #111; color: #fff; border-color: #fff; }
.st-key-leave_present button p, .st-key-leave_present button span { font-size: 0.95rem; color: #fff !important; }
/* a page's stepping controls (a container keyed STEP_BAR...): a bar fixed at the bottom of the
   window, so the step buttons and the chart they change are on screen together */
[class*="st-key-slide_step_bar"] { position: fixed; left: 0; right: 0; bottom: 0; z-index: 999;
  width: auto !important; background: #fff; border-top: 1px solid #bbb;
  padding: 0.3rem 1.5rem 0.1rem; }
[data-testid="stMainBlockContainer"]:has([class*="st-key-slide_step_bar"]) { padding-bottom: 9rem; }
/* the page's own controls (step buttons, sliders, selects) readable from the back of the room */
[data-testid="stMainBlockContainer"] [data-testid="stBaseButton-secondary"] { border: 1px solid #555;
  color: #111; font-size: 1.05rem; padding: 0.35rem 1rem; }
[data-testid="stMainBlockContainer"] [data-testid="stWidgetLabel"] p { font-size: 1.05rem; color: #222; }
[data-testid="stMainBlockContainer"] [data-testid="stSlider"] [data-testid="stThumbValue"],
[data-testid="stMainBlockContainer"] [data-testid="stSelectbox"] [data-baseweb="select"] * { font-size: 1.05rem;
  color: #111; }
</style>
"""

# Scale each chart so its whole slide fits the window (a CSS transform: Plotly maps the pointer
# through it, and Streamlit still lays the chart out at its own size); runs again as charts re-render or the window
# changes, and undoes itself when presentation mode ends (the Leave button is gone).
TOP_PX = 56            # a slide's top edge in the window: below the fixed Controls pill and Leave button
TAIL_PX = 56           # a slide's menus under its chart when it has none measured yet (one export row)
LEAD_SHARE = 0.3       # a chart's own controls above it belong to its slide up to this share of the window

FIT = """
<script>
(() => {
  if (window.__tilescopeFit) return;
  const TOP_PX = __TOP_PX__, TAIL_PX = __TAIL_PX__, LEAD_SHARE = __LEAD_SHARE__, PAGES = __PAGES__;
  const FIXED = '.st-key-slide_controls, .st-key-leave_present, [class*="st-key-slide_step_bar"], [data-testid="stPopoverBody"], #tilescope-where';
  // The slides, one layout rule for every page: a slide is a chart with the page's controls
  // drawn just above it, after the previous chart (the animation's head picker, a "Draw the
  // imbalance chart" switch), and its menus under it (export, video). Controls taller than
  // LEAD_SHARE of the window stay above the slide.
  const slides = () => {
    const out = [];
    let lead = [];
    document.querySelectorAll('[data-testid="stMain"] [data-testid="stElementContainer"], [data-testid="stMain"] [data-testid="stPopover"]').forEach(c => {
      if (c.offsetHeight === 0 || c.closest(FIXED)) return;
      if (c.dataset.testid === 'stPopover') {    // a chart's menu; the page's trace data (keyed ..._data) is not its
        if (out.length && !lead.length && !/\\bst-key-\\w+_data\\b/.test(c.parentElement.className)) out[out.length - 1].tail.push(c);
        return;
      }
      const plot = c.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
      if (plot) { out.push({box: c, plot, lead, tail: []}); lead = []; }
      else if (c.querySelector('input, button, textarea, [role="slider"], [role="combobox"]')) lead.push(c);
    });
    return out;
  };
  // where a slide starts (its first control, or its chart) and its controls' height above the chart
  const extent = s => {
    const r = s.plot.getBoundingClientRect();
    const top = s.lead.length ? Math.min(...s.lead.map(c => c.getBoundingClientRect().top)) : r.top;
    const lead = r.top - top;
    return lead > 0 && lead <= LEAD_SHARE * window.innerHeight ? {top, lead, bottom: r.bottom} : {top: r.top, lead: 0, bottom: r.bottom};
  };
  // the height of the slide's menus under its chart (its export row, a video menu) and the page's
  // gap above them (1rem), measured from the menus alone: it must not change with the chart's scale
  const tailOf = s => {
    if (!s.tail.length) return TAIL_PX;
    const gap = parseFloat(getComputedStyle(document.documentElement).fontSize) + 8;
    return Math.max(TAIL_PX, Math.ceil(s.tail[s.tail.length - 1].getBoundingClientRect().bottom
                                       - s.tail[0].getBoundingClientRect().top + gap));
  };
  // the row of the page holding an element: the child of the block it shares with the slide's chart
  const rowOf = (el, box) => {
    let row = el;
    while (row.parentElement && !row.parentElement.contains(box)) row = row.parentElement;
    return row;
  };
  const fit = () => {
    const on = !!document.querySelector('.st-key-leave_present');
    const main = document.querySelector('[data-testid="stMainBlockContainer"]');
    slides().forEach((s, k) => {
      const p = s.plot, box = s.box;
      const row = rowOf(s.lead.length && extent(s).lead ? s.lead[0] : box, box);
      if (!on || !p.layout) {
        if (p.style.transform) { p.style.transform = ''; box.style.marginLeft = ''; box.style.marginBottom = ''; }
        if (row.style.marginTop) row.style.marginTop = '';
        return;
      }
      // every slide after the first starts TOP_PX below what comes before it, so the previous
      // slide's menus are never in the band of the fixed pills when this one is brought up
      const gapTop = k ? `${TOP_PX + 8}px` : '';
      if (row.style.marginTop !== gapTop) row.style.marginTop = gapTop;
      // the slide size the server fixed (layout.meta.slide_px): Streamlit may re-lay the plot out
      const size = (p.layout.meta && p.layout.meta.slide_px) || [p.layout.width, p.layout.height];
      const [fw, fh] = size;
      const bar = document.querySelector('[class*="st-key-slide_step_bar"]');   // fixed at the bottom
      // the slide (its controls, the chart) and its menus under it fit the window below the
      // fixed pills and above the step bar
      const margin = (window.innerHeight - 72) * 0.02;     // the chart's own top and bottom margin (CSS)
      const W = main.clientWidth - 32,
            H = window.innerHeight - TOP_PX - tailOf(s) - extent(s).lead - 2 * margin - (bar ? bar.offsetHeight : 0);
      const was = parseFloat((p.style.transform.match(/scale\\(([\\d.]+)\\)/) || [])[1]);
      let z = Math.min(W / fw, H / fh);
      if (Math.abs(z - was) < 0.004) z = was;      // the same slide: no re-layout for a rounding's worth
      const want = {transform: `scale(${z.toFixed(3)})`,
                    marginLeft: `${Math.max(0, (W - fw * z) / 2).toFixed(0)}px`,
                    marginBottom: `${(fh * (z - 1)).toFixed(0)}px`};   // the scaled chart's extra height
      // the plot inside Streamlit's element is scaled, so Streamlit still measures the slide size;
      // set every tick: a re-render may drop inline styles
      p.style.transformOrigin = 'top left';
      if (p.style.transform !== want.transform) p.style.transform = want.transform;
      if (box.style.marginLeft !== want.marginLeft) box.style.marginLeft = want.marginLeft;
      if (box.style.marginBottom !== want.marginBottom) box.style.marginBottom = want.marginBottom;
      for (let a = p.parentElement; a && a !== box.parentElement; a = a.parentElement) a.style.overflow = 'visible';
    });
  };
  // scroll the page's own container so a slide's top sits at TOP_PX, below the fixed pills
  // (scrollIntoView would also scroll sideways: the chart's layout box is its unscaled slide size)
  const scroller = () => {
    const sc = document.querySelector('[data-testid="stMain"]');
    return sc && sc.scrollHeight > sc.clientHeight ? sc : null;
  };
  const show = s => {
    const top = extent(s).top, sc = scroller();
    if (sc) sc.scrollTo({top: sc.scrollTop + top - TOP_PX, behavior: 'instant'});
    else window.scrollBy({top: top - TOP_PX, behavior: 'instant'});
  };
  const pageName = () => new URLSearchParams(location.search).get('page')
      || location.pathname.split('/').filter(Boolean).pop() || '';
  // the current slide: the last whose top is at the slide position (or above it) or that is seen
  // whole (-1 above the first)
  const barBottom = () => {
    const bar = document.querySelector('[class*="st-key-slide_step_bar"]');
    return window.innerHeight - (bar ? bar.offsetHeight : 0);
  };
  const whole = r => r.top >= -2 && r.bottom <= barBottom() + 2;
  const current = rects => { let cur = -1; rects.forEach((r, i) => { if (r.top <= TOP_PX + 4 || whole(r)) cur = i; }); return cur; };
  // stepping past a page's last slide opens the next page of the sidebar (PAGES, its order), and
  // before its first the previous one, at its last slide: the page's own link is clicked (the
  // session and its presentation mode stay), and where to land is kept until that page settles
  const running = () => {
    const app = document.querySelector('[data-testid="stApp"]');
    return (app && app.getAttribute('data-test-script-state') === 'running')
      || /Running/.test((document.querySelector('[data-testid="stStatusWidget"]') || {}).innerText || '');
  };
  const turn = step => {
    if (running()) return true;          // the page is still drawing its slides: stay on it
    const names = PAGES.map(p => p[0]), at = names.indexOf(pageName());
    const to = PAGES[at + step];
    if (at < 0 || !to) return false;
    const link = [...document.querySelectorAll('[data-testid="stSidebarNav"] a')].find(a => a.innerText.trim() === to[1]);
    sessionStorage.setItem('tilescopeLand', JSON.stringify({page: to[0], at: step > 0 ? 'first' : 'last'}));
    landStable = 0; landAt = '';
    if (link) link.click();
    else { const q = new URLSearchParams(location.search); q.set('page', to[0]); location.href = `./${to[0]}?${q}`; }
    return true;
  };
  // on the page a turn opened: once its slides stop moving (three ticks alike), the first one at
  // the top of the window or the last one brought up
  let landStable = 0, landAt = '';
  const land = () => {
    const want = JSON.parse(sessionStorage.getItem('tilescopeLand') || 'null');
    if (!want || want.page !== pageName() || running()) return;
    const list = slides();
    if (!list.length || !list.every(s => s.plot.style.transform)) return;
    const at = `${list.length},${Math.round(list[list.length - 1].box.getBoundingClientRect().height)}`;
    landStable = at === landAt ? landStable + 1 : 0;
    landAt = at;
    if (landStable < 3) return;
    sessionStorage.removeItem('tilescopeLand');
    window.__tilescopeShown = location.pathname + '?' + pageName();   // the page's opening scroll is this one
    if (want.at === 'last') show(list[list.length - 1]);
    else { const sc = scroller(); if (sc) sc.scrollTo({top: 0, behavior: 'instant'}); else window.scrollTo(0, 0); }
  };
  // where the room is: "page · slide n / m", faint at the top of the window between the pills
  const where = () => {
    let el = document.getElementById('tilescope-where');
    const on = !!document.querySelector('.st-key-leave_present');
    if (!on) { if (el) el.remove(); return; }
    if (!el) {
      el = document.createElement('div');
      el.id = 'tilescope-where';
      el.style.cssText = 'position:fixed;top:0.85rem;left:50%;transform:translateX(-50%);z-index:1000;'
        + 'font:600 0.95rem sans-serif;color:#333;background:rgba(255,255,255,0.85);padding:0.15rem 0.7rem;'
        + 'border-radius:1rem;opacity:0.7;pointer-events:none;white-space:nowrap';
      document.body.appendChild(el);
    }
    const list = slides(), page = PAGES.find(p => p[0] === pageName());
    const cur = Math.max(0, current(list.map(extent)));
    const text = `${page ? page[1] : ''} · slide ${list.length ? cur + 1 : 0} / ${list.length}`;
    if (el.textContent !== text) el.textContent = text;
  };
  // a page whose own controls push its first slide under the step bar (online softmax) opens
  // with that slide brought up whole, once per page: the bar never hides its axis titles
  const firstWhole = () => {
    const bar = document.querySelector('[class*="st-key-slide_step_bar"]');
    const first = slides()[0];
    const page = location.pathname + '?' + pageName();
    if (!bar || !first || !first.plot.style.transform || window.__tilescopeShown === page) return;
    const r = extent(first);
    // act once the page has stopped moving (three ticks alike): content drawn later above the
    // chart would otherwise shift it after the scroll
    const at = `${Math.round(r.top)},${Math.round(r.bottom)}`;
    stable = at === lastAt ? stable + 1 : 0;
    lastAt = at;
    if (stable < 3) return;
    window.__tilescopeShown = page;
    if (r.bottom > window.innerHeight - bar.offsetHeight + 2 || r.top < 0) show(first);
  };
  let stable = 0, lastAt = '';
  // the slides as the fit sees them (the browser tests read them): chart box, lead and tail heights
  window.__tilescopeSlides = () => slides().map(s => ({chart: s.plot.getBoundingClientRect().toJSON(),
    lead: extent(s).lead, tail: tailOf(s), menus: s.tail.map(c => c.getBoundingClientRect().toJSON())}));
  // how many ticks in a row the slides have stood still (their charts' and menus' boxes, the label):
  // the browser tests wait for the layout to settle on it, not for a time
  let still = 0, lastSig = '';
  const stillness = () => {
    const box = e => { const r = e.getBoundingClientRect(); return [r.top, r.height, r.width].map(Math.round).join(','); };
    const sig = slides().map(s => [s.plot, ...s.tail].map(box).join(' ')).join(';')
      + '|' + ((document.getElementById('tilescope-where') || {}).textContent || '');
    still = sig === lastSig ? still + 1 : 0;
    lastSig = sig;
    window.__tilescopeStill = still;
    window.__tilescopeTicks = (window.__tilescopeTicks || 0) + 1;
  };
  window.__tilescopeFit = setInterval(() => { fit(); land(); firstWhole(); where(); stillness(); }, 300);
  // next / previous slide: PageDown or → / PageUp or ←: scroll the next slide's top to TOP_PX
  // (a slide fits above the step bar, so it is seen whole); past either end, the next or the
  // previous page; typing in a control is left alone
  window.addEventListener('keydown', e => {
    if (!document.querySelector('.st-key-leave_present') || e.altKey || e.ctrlKey || e.metaKey) return;
    const t = e.target, tag = (t && t.tagName) || '';
    if (/INPUT|TEXTAREA|SELECT/.test(tag) || (t && t.isContentEditable) || (t && t.closest && t.closest('[role="slider"],[role="listbox"],[role="combobox"],[data-baseweb="popover"]'))) return;
    const step = {PageDown: 1, ArrowRight: 1, PageUp: -1, ArrowLeft: -1}[e.key];
    if (!step) return;
    const list = slides();
    e.preventDefault();
    if (!list.length) { turn(step); return; }
    // below the current slide the next (a first slide under the page's own controls is seen
    // whole or not: PageDown then brings it up whole first)
    const rects = list.map(extent);
    const cur = current(rects);
    let next;
    if (step > 0) next = cur >= 0 && !whole(rects[cur]) && rects[cur].top > TOP_PX + 4 ? cur : cur + 1;
    else next = cur >= 0 && rects[cur].top < TOP_PX - 4 ? cur : cur - 1;
    if ((next >= list.length || next < 0) && turn(step)) return;
    show(list[Math.max(0, Math.min(list.length - 1, next))]);
  }, true);
  window.addEventListener('resize', fit);
})();
</script>
"""


def _leave() -> None:
    st.session_state["ctl_present"] = False


def apply() -> None:
    """Turn the page into slides (call once per run, before the view draws)."""
    st.html(CSS)
    from app.settings import PAGES       # the sidebar's order, pages added later included

    st.html(FIT.replace("__TAIL_PX__", str(TAIL_PX)).replace("__TOP_PX__", str(TOP_PX))
            .replace("__LEAD_SHARE__", str(LEAD_SHARE)).replace("__PAGES__", json.dumps(list(PAGES.items()))),
            unsafe_allow_javascript=True)
    st.button("✕ Leave presentation", key="leave_present", on_click=_leave,
              help="back to the normal view with the sidebar (the link's present=1 goes too)")

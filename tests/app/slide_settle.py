"""Waiting for a presentation-mode page's layout to settle, for the browser tests of slides: no
fixed sleeps (a loaded machine lays the page out seconds later than an idle one), but the page's
own state: the script idle, no page turn pending, the charts drawn and scaled by the fit script
(app/presentation.py), a page with a step bar's first slide brought up whole (once per page, by the
fit script), the fit script's boxes still over two of its ticks, no CSS transition
running, and every element's box unchanged over three checks POLL_MS apart (checked at every
animation frame, the page drew ~60 frames a second for the wait, each check a layout query over
every element: ~0.1 s of Chromium's CPU per second of waiting). It does not wait for
lazily loaded elements (a skeleton until their code arrives): what the room sees meanwhile is
tested as it is."""

from __future__ import annotations

POLL_MS = 100

SETTLED_JS = """([n, t0]) => {
  const app = document.querySelector('[data-testid="stApp"]');
  const status = document.querySelector('[data-testid="stStatusWidget"]');
  const idle = !(app && app.getAttribute('data-test-script-state') === 'running')
    && !(status && /Running/.test(status.innerText));
  const plots = [...document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')];
  // a page with a step bar brings its first slide up whole once (the fit script's firstWhole, after
  // three ticks alike): until it has, a scroll made now would be undone by it
  const bar = document.querySelector('[class*="st-key-slide_step_bar"]');
  const page = location.pathname + '?' + (new URLSearchParams(location.search).get('page')
      || location.pathname.split('/').filter(Boolean).pop() || '');
  const ready = idle && !sessionStorage.getItem('tilescopeLand') && plots.length >= n
    && (!bar || window.__tilescopeShown === page)
    && plots.every(p => p.querySelector('.main-svg') && p.style.transform.startsWith('scale'))
    && document.getElementById('tilescope-where')
    && (window.__tilescopeTicks || 0) >= t0 + 2 && (window.__tilescopeStill || 0) >= 2
    && !document.getAnimations().some(a => a.playState === 'running' && a instanceof CSSTransition);
  const boxes = ready ? [...document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot, '
      + '[data-testid="stMain"] [data-testid="stPopover"], [data-testid="stMain"] [data-testid="stElementContainer"]')]
    .map(e => { const r = e.getBoundingClientRect(); return [r.top, r.left, r.width, r.height].map(Math.round).join(':'); })
    .join(',') : '';
  const w = window.__tsSettle || (window.__tsSettle = {sig: '', same: 0});
  w.same = boxes && boxes === w.sig ? w.same + 1 : 0;
  w.sig = boxes;
  return w.same >= 2;
}"""


def settle(page, n: int = 1, timeout_ms: int = 180_000) -> None:
    """Until the presentation-mode layout of `page` has settled with at least `n` charts (see the
    module's docstring); the fit script must tick twice from now, so a change just made (a key
    press, a scroll, a hover) is seen by it."""
    t0 = page.evaluate("() => { window.__tsSettle = null; return window.__tilescopeTicks || 0; }")
    page.wait_for_function(SETTLED_JS, arg=[n, t0], polling=POLL_MS, timeout=timeout_ms)


# a frame's style pass comes after its animation-frame callbacks: a transition the pointer started
# exists from the second frame on, so the check begins there
QUIET_JS = """() => new Promise(done => {
  const check = () => document.getAnimations().some(a => a.playState === 'running' && a instanceof CSSTransition)
    ? requestAnimationFrame(check) : requestAnimationFrame(() => requestAnimationFrame(() => done(true)));
  requestAnimationFrame(() => requestAnimationFrame(check));
})"""


def quiet(page) -> None:
    """Until no CSS transition runs on `page` (a hover's fade, 0.2 s here) and two frames have
    been drawn since: what the pointer changed is on screen."""
    page.evaluate(QUIET_JS)

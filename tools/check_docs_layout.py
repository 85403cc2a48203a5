"""The built docs at a laptop's width: no code block scrolls sideways.

    python tools/check_docs_layout.py [docs/_build/html] [--width 1366 --height 900]
                                      [--pages index collectives ...] [--screenshot collectives]

Opens each page of the built site in headless Chromium (Debian's ``chromium``: ``apt-get install
-y chromium``) at the given window size, with a small script added to a temporary copy of the
page that measures every visible ``pre`` once the page has loaded: the block overflows when its
``scrollWidth`` exceeds its ``clientWidth``. It also measures how many characters of the code font
fit in a block (the ``--min-chars`` a code line may have without a scroll bar; 100 by default).

Prints one line per page, then each overflowing block (page, block, its first line, its longest
line against what fits); exits 1 when any block overflows or the code column is narrower than
``--min-chars``. ``--screenshot PAGE`` also saves ``<build>/../layout-<PAGE>-<width>.png``.
Chromium's ``--dump-dom`` returns the page after the script ran: no driver, nothing from PyPI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BROWSERS = ["chromium", "chromium-browser", "google-chrome", "chrome"]
#: The site's own pages (not viewcode's _modules/, whose lines are the source's, nor genindex/search).
SKIP = re.compile(r"^(_modules|_sources|_static|genindex|search|py-modindex)")
REPORT_ID = "iris-layout-report"
#: Blocks inside this class are measured tables (benchmark results), not code: they may scroll.
EXEMPT = "iris-results"

# Runs in the page after load; the report goes into the DOM, which --dump-dom prints.
PROBE = """
<script>
window.addEventListener("load", function () {
  var blocks = [], exempt = 0;
  document.querySelectorAll("pre").forEach(function (pre, index) {
    if (pre.offsetParent === null) { return; }  // hidden (a closed dropdown): nothing to see
    if (pre.closest(".EXEMPT_CLASS")) { exempt += 1; return; }  // a results table: wide by design
    var probe = document.createElement("span");
    probe.textContent = "0".repeat(100);
    probe.style.position = "absolute";
    probe.style.visibility = "hidden";
    pre.appendChild(probe);
    var charWidth = probe.getBoundingClientRect().width / 100;
    pre.removeChild(probe);
    var style = getComputedStyle(pre);
    var inner = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    var lines = pre.textContent.split("\\n");
    blocks.push({
      index: index, scrollWidth: pre.scrollWidth, clientWidth: pre.clientWidth,
      fits: Math.floor(inner / charWidth),
      longest: Math.max.apply(null, lines.map(function (l) { return l.length; })),
      first: lines[0].slice(0, 70)
    });
  });
  var out = document.createElement("script");
  out.type = "application/json";
  out.id = "REPORT_ID";
  var report = {width: window.innerWidth, blocks: blocks, exempt: exempt};
  // No "<" or "&" in the script's text: the DOM dump prints it as it is.
  out.textContent = JSON.stringify(report).replace(/</g, "\\\\u003c").replace(/&/g, "\\\\u0026");
  document.body.appendChild(out);
});
</script>
""".replace("EXEMPT_CLASS", EXEMPT).replace("REPORT_ID", REPORT_ID)


def find_browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("check_docs_layout: no headless browser found (looked for " + ", ".join(BROWSERS) +
                     "); install Debian's: apt-get install -y chromium")


def browser_args(browser: str, width: int, height: int, profile: str) -> list[str]:
    # --no-sandbox: CI runs as root, where Chromium refuses its sandbox.
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={profile}", f"--window-size={width},{height}", "--virtual-time-budget=10000"]


def pages_of(build: str, wanted: list[str] | None) -> list[str]:
    """Pages relative to the build folder, without ``.html``."""
    if wanted:
        return wanted
    found = []
    for folder, _, files in os.walk(build):
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), build)
            if name.endswith(".html") and not SKIP.match(rel):
                found.append(rel[:-5])
    return sorted(found)


def measure(browser: list[str], build: str, page: str) -> dict:
    """The report of one page: the window width and every visible ``pre``."""
    source = os.path.join(build, page + ".html")
    if not os.path.exists(source):
        raise SystemExit(f"check_docs_layout: {source} does not exist; build the docs first (nox -s docs)")
    # A copy beside the page, so that its relative links (CSS, fonts) resolve the same.
    probe_page = os.path.join(os.path.dirname(source), f".layout-probe-{os.path.basename(page)}.html")
    with open(source, encoding="utf-8") as f:
        text = f.read()
    with open(probe_page, "w", encoding="utf-8") as f:
        f.write(text.replace("</body>", PROBE + "</body>", 1))
    try:
        proc = subprocess.run([*browser, "--dump-dom", "file://" + probe_page],
                              capture_output=True, text=True, timeout=120)
    finally:
        os.remove(probe_page)
    match = re.search(rf'<script type="application/json" id="{REPORT_ID}">(.*?)</script>', proc.stdout, re.S)
    if not match:
        raise SystemExit(f"check_docs_layout: {' '.join(browser[:2])} --dump-dom {page}.html gave no report "
                         f"(exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
    return json.loads(match.group(1))


def screenshot(browser: list[str], build: str, page: str, width: int) -> str:
    out = os.path.join(os.path.dirname(os.path.abspath(build)), f"layout-{page.replace('/', '-')}-{width}.png")
    subprocess.run([*browser, f"--screenshot={out}", "file://" + os.path.join(os.path.abspath(build), page + ".html")],
                   capture_output=True, timeout=120, check=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", nargs="?", default=os.path.join(ROOT, "docs", "_build", "html"))
    parser.add_argument("--width", type=int, default=1366)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--pages", nargs="+", help="pages without .html (default: every page of the site)")
    parser.add_argument("--min-chars", type=int, default=100,
                        help="characters a code line may have without scrolling (default 100)")
    parser.add_argument("--screenshot", metavar="PAGE", help="also save a screenshot of this page")
    args = parser.parse_args(argv)
    build = os.path.abspath(args.build)
    with tempfile.TemporaryDirectory(prefix="iris-docs-layout-") as profile:
        browser = browser_args(find_browser(), args.width, args.height, profile)
        problems, narrowest = [], None
        for page in pages_of(build, args.pages):
            report = measure(browser, build, page)
            blocks = report["blocks"]
            over = [b for b in blocks if b["scrollWidth"] > b["clientWidth"]]
            fits = min((b["fits"] for b in blocks), default=None)
            if fits is not None:
                narrowest = fits if narrowest is None else min(narrowest, fits)
            print(f"{page}: {len(blocks)} code blocks at {report['width']} px, "
                  f"{len(over)} overflow" + (f", {fits} characters fit" if fits is not None else "") +
                  (f" ({report['exempt']} result tables exempt)" if report["exempt"] else ""))
            for b in over:
                problems.append(f"  {page}.html, block {b['index']} ({b['first']!r}...): longest line "
                                f"{b['longest']} characters, {b['fits']} fit ({b['scrollWidth']} px of content "
                                f"in {b['clientWidth']} px): wrap the line at its source")
        if args.screenshot:
            print(f"screenshot: {screenshot(browser, build, args.screenshot, args.width)}")
    if narrowest is not None and narrowest < args.min_chars:
        problems.append(f"  the narrowest code block fits {narrowest} characters at {args.width} px, "
                        f"fewer than --min-chars {args.min_chars}: widen the article (docs/_static/layout.css)")
    if problems:
        print(f"\ncode blocks that scroll sideways at {args.width}x{args.height}:", *problems, sep="\n")
        return 1
    print(f"\nno code block scrolls sideways at {args.width}x{args.height}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

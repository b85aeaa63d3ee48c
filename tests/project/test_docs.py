"""The documentation site: `docs/build.py` (what `make docs` runs) builds it from nbs/, then headless Chromium opens
every page over a loopback HTTP server: pages load, site-relative links and images resolve (anchors included), every
exported symbol of a module has its API entry, and the browser logs no error. Screenshots of every page are copied to
tests/artifacts/docs/ (gitignored)."""
import collections
import functools
import http.server
import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts" / "docs"
INSTALL_HINT = "`make docs` installs them (Debian: apt-get install -y chromium chromium-driver)"


def _builder():
    spec = importlib.util.spec_from_file_location("adaptkit_docs_build", ROOT / "docs" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _url(md_path):
    "The site-relative URL MkDocs gives a Markdown page (directory URLs)."
    p = Path(md_path).with_suffix("")
    if p.name == "index": p = p.parent  # a section's index page is the section's URL
    return "" if p == Path(".") else p.as_posix() + "/"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    res = subprocess.run(
        [sys.executable, "docs/build.py", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, f"docs build failed:\n{res.stdout}\n{res.stderr}"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield out, f"http://127.0.0.1:{server.server_address[1]}/", res.stderr
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if not chromium or not driver_bin:
        pytest.fail(f"headless Chromium is needed for the docs test but chromium={chromium} "
                    f"chromedriver={driver_bin}: {INSTALL_HINT}")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing: it is a dev requirement (settings.ini); `make test` installs it")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1600",
                "--disable-extensions", "--no-first-run", "--disable-background-networking"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=driver_bin))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _expected_pages():
    "(url, kind, module name or None) for the home page, every module notebook and every tutorial, found by glob."
    b = _builder()
    home, mods, tuts = b.notebooks()
    pages = [(_url(b.page_path(home, b._read(home))), "home", None)]
    pages += [(_url(b.page_path(p, b._read(p))), "module", b._default_exp(b._read(p))) for p in mods]
    pages += [(_url(b.page_path(p, b._read(p))), "tutorial", None) for p in tuts]
    return b, pages


def _fetch(url):
    "HTTP status of `url` and the element ids its HTML has (read once per target, whatever the anchors asked of it)."
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, set(re.findall(r'id="([^"]*)"', r.read().decode("utf-8", "replace")))
    except urllib.error.HTTPError as e:
        return e.code, set()


# What the page checks read from a loaded page, gathered in one script: its state, title and first heading, every link,
# image, stylesheet and script it refers to, every element id (in order, duplicates kept), the images that failed, and
# any object address an API entry shows (`<function f at 0x7f...>`: a value that differs between two builds).
PAGE_FACTS = """return {
  ready: document.readyState, title: document.title, h1: document.querySelector('article h1')?.innerText || '',
  refs: [...document.querySelectorAll('a[href]')].map(a => a.href)
    .concat([...document.querySelectorAll('img[src], link[href], script[src]')].map(e => e.src || e.href)),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  broken_images: [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src),
  addresses: [...document.querySelectorAll('.api-entry')]
    .flatMap(e => e.innerText.match(/<[^<>]* at 0x[0-9a-f]+>/g) || []),
}"""


def test_docs_site_in_chromium(browser, site):  # browser first: no Chromium fails before the build
    out, base, build_log = site
    b, pages = _expected_pages()
    assert len([p for p in pages if p[1] == "module"]) >= 1
    shots = Path(out).parent / "screenshots"
    shots.mkdir(exist_ok=True)
    fetched, problems = {}, []
    browser.get_log("browser")  # start from an empty log
    for url, kind, modname in pages:
        assert (Path(out) / url / "index.html").is_file(), f"no page built for {url or 'home'}"
        browser.get(base + url)
        page = browser.execute_script(PAGE_FACTS)  # one round trip to the browser for every fact the checks read
        assert page["ready"] == "complete", f"{url}: document.readyState {page['ready']!r}"
        assert "404" not in page["title"], f"{url}: {page['title']}"
        assert page["h1"].strip(), f"{url}: page has no title"
        name = (url.strip("/").replace("/", "_") or "index") + ".png"
        browser.save_screenshot(str(shots / name))
        # every site-relative link and image resolves, and so does its #anchor
        for ref in page["refs"]:
            target, frag = urldefrag(ref)
            if urlparse(target).netloc != urlparse(base).netloc:
                continue
            if target not in fetched:
                fetched[target] = _fetch(target)
            status, target_ids = fetched[target]
            if status != 200:
                problems.append(f"{url or 'home'}: {ref} -> HTTP {status}")
            elif frag and frag not in target_ids:
                problems.append(f"{url or 'home'}: {ref} -> no element with id {frag!r}")
        ids = collections.Counter(page["ids"])
        problems += [f"{url or 'home'}: duplicate id {i!r}" for i, n in ids.items() if n > 1]
        problems += [f"{url or 'home'}: image does not load: {src}" for src in page["broken_images"]]
        problems += [f"{url}: an API entry shows an object's address: {a}" for a in page["addresses"]]
        if kind == "module" and modname:
            mod = importlib.import_module(f"adaptkit.{modname}")
            problems += [f"{url}: no API entry for {modname}.{sym}" for sym in mod.__all__ if b._anchor(sym) not in ids]
        problems += [
            f"{url or 'home'}: console: {e['message']}" for e in browser.get_log("browser") if e["level"] == "SEVERE"
        ]
    # the search box finds an API entry (MkDocs' prebuilt index, searched in the browser, offline)
    from selenium.webdriver.support.ui import WebDriverWait
    browser.get(base)
    box = browser.find_element("css selector", "input[data-md-component=search-query]")
    box.click()
    box.send_keys("push_folder")
    hits = WebDriverWait(browser, 15).until(lambda d: d.find_elements("css selector", ".md-search-result__item"))
    assert any("push_folder" in h.text for h in hits), [h.text for h in hits]
    browser.save_screenshot(str(shots / "search.png"))
    problems += [f"search: console: {e['message']}" for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for png in shots.glob("*.png"):
        shutil.copy(png, ARTIFACTS / png.name)
    assert not problems, "\n".join(problems)
    assert "WARNING" not in build_log, f"the docs build warned:\n{build_log}"


def test_stored_outputs_render(tmp_path, monkeypatch):
    "A tutorial's committed outputs (text, plots, HTML and Markdown tables) reach its page unchanged; stderr does not."
    import base64
    import json
    b = _builder()
    nbs = tmp_path / "nbs"
    (nbs / "tutorials").mkdir(parents=True)
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    )
    code = lambda src, outs: {"cell_type": "code", "execution_count": 1, "metadata": {}, "source": src, "outputs": outs}
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": "# A tutorial\n\nProse."},
        code(
            "#| slow\nprint('hi')",
            [
                {"output_type": "stream", "name": "stdout", "text": ["accuracy 0.93\n"]},
                {"output_type": "stream", "name": "stderr", "text": ["progress bar noise\n"]},
            ],
        ),
        code(
            "plot()",
            [
                {
                    "output_type": "display_data",
                    "metadata": {},
                    "data": {"image/png": base64.b64encode(png).decode(), "text/plain": "<Figure>"},
                }
            ],
        ),
        code(
            "df",
            [
                {
                    "output_type": "execute_result",
                    "execution_count": 2,
                    "metadata": {},
                    "data": {"text/html": "<table><tr><td>lora</td><td>0.41</td></tr></table>", "text/plain": "df"},
                }
            ],
        ),
        code(
            "#| echo: false\nshow()",
            [
                {
                    "output_type": "display_data",
                    "metadata": {},
                    "data": {"text/markdown": "| method | acc |\n|---|---|\n| pissa | 0.5 |"},
                }
            ],
        ),
        code("#| hide\nsecret = 1", []),
    ]
    nb_path = nbs / "tutorials" / "t.ipynb"
    nb_path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    monkeypatch.setattr(b, "NBS", nbs)
    md = b.Page(nb_path, tmp_path / "docs", {}, {}).render()
    assert "# A tutorial" in md and "accuracy 0.93" in md and "progress bar noise" not in md
    assert "<td>0.41</td>" in md and "| pissa | 0.5 |" in md
    assert "show()" not in md and "secret" not in md and "#| slow" not in md and "print('hi')" in md
    img = re.search(r"!\[output\]\(([^)]+)\)", md).group(1)
    assert (tmp_path / "docs" / "tutorials" / img).resolve().read_bytes() == png


def test_api_values_render_without_object_addresses():
    "A module-level value's entry names functions, classes and modules by their dotted names, and sorts its sets."
    import dataclasses
    import typing
    b = _builder()

    @dataclasses.dataclass
    class Step:
        run: typing.Callable
        tags: frozenset
        hidden: object = dataclasses.field(default=None, repr=False)

    class Pair(typing.NamedTuple):
        kind: type
        module: object

    value = {"a": Step(_url, frozenset({"z", "b"})), "b": [Pair(Path, re), (len,), set()], "c": {3, 1}}
    text = b._render_value(value, "VALUE", 3)
    assert "0x" not in text, text
    assert (
        f"VALUE: dict = {{'a': Step(run={_url.__module__}._url, tags=frozenset({{'b', 'z'}})), "
        "'b': [Pair(kind=pathlib.Path, module=re), (builtins.len,), set()], 'c': {1, 3}}"
    ) in text
    assert eval(b._stable_repr([1, "x", (2,), {"k": None}])) == [1, "x", (2,), {"k": None}]  # plain values as repr

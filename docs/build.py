"""Build the documentation site from nbs/ without Quarto and without executing notebooks: each notebook becomes a
Markdown page (prose, code, stored outputs, plots), exported symbols get API entries rendered from their docstrings
and docments by fastcore's `MarkdownRenderer` (what nbdev's `show_doc` uses), and MkDocs (Material theme) renders
the site. Usage: `python docs/build.py [--out DIR]` (default `_docs/`)."""
import argparse
import ast
import base64
import contextlib
import functools
import importlib
import inspect
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_readme import _split_directives, _text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
_ansi = re.compile(r"\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])")
_link = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
_tick = re.compile(r"(?<![\[`\w])`([A-Za-z_][\w.]*)`(?![\]`(])")
_HIDE = {"hide", "exporti", "default_exp", "include: false"}
_IMAGES = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif"}


METHODS = ("pissa", "aligner", "repnoise", "translora", "emr")  # the site's navigation: methods first, then the Hub,
HUB = ("hub", "localhub")  # then the core modules below them


def notebooks():
    "(home, module notebooks, tutorials): found by glob, so new numbered notebooks join the site by themselves."
    packages = [NBS / name for name in (*METHODS, *HUB)]
    mods = [p for folder in packages for p in sorted(folder.glob("[0-9]*.ipynb"))] + sorted(NBS.glob("[0-9]*.ipynb"))
    tuts = sorted((NBS / "tutorials").glob("*.ipynb"))
    return NBS / "index.ipynb", mods, tuts


def _section(nb_path):
    "The navigation section of a module notebook: Methods, Hub or Core, and the package it belongs to (None for Core)."
    folder = Path(nb_path).relative_to(NBS).parent.name
    return ("Methods" if folder in METHODS else "Hub" if folder in HUB else "Core"), folder or None


def _read(nb_path):
    return json.loads(Path(nb_path).read_text(encoding="utf-8"))


def _default_exp(nb):
    for cell in nb["cells"]:
        m = (
            re.search(r"^\s*#\s*\|\s*default_exp\s+(\S+)", _text(cell["source"]), re.M)
            if cell["cell_type"] == "code"
            else None
        )
        if m:
            return m.group(1).removesuffix(".__init__")  # a package's notebook documents the package


def _title(nb, fallback):
    for cell in nb["cells"]:
        m = re.search(r"^#\s+(.+)$", _text(cell["source"]), re.M) if cell["cell_type"] == "markdown" else None
        if m:
            return m.group(1).strip()
    return fallback


def page_path(nb_path, nb):
    "Where `nb_path`'s page lies in the site's source tree: index.md, <module>.md, tutorials/<stem>.md."
    rel = Path(nb_path).relative_to(NBS)
    if rel.name == "index.ipynb" and rel.parent == Path("."):
        return Path("index.md")
    mod = _default_exp(nb)
    if not mod or rel.parts[0] == "tutorials": return rel.with_suffix(".md")
    return Path(
        mod.replace(".", "/") + ("/index.md" if rel.stem.startswith("00_") and rel.parent != Path(".") else ".md")
    )


def _anchor(name):
    "The id of `name`'s API entry: the name itself (case kept, so `LocalHub` and the page title `localhub` differ)."
    return name


def _rel(target, start):
    "Relative path from the page `start` to `target` (both relative to the docs folder)."
    import os
    return Path(os.path.relpath(target, Path(start).parent)).as_posix()


# ---- API entries ----------------------------------------------------------------------------------------------------
def _is_patch(node):
    return any(
        (isinstance(d, ast.Name) and d.id == "patch")
        or (isinstance(d, ast.Call) and getattr(d.func, "id", "") == "patch")
        for d in node.decorator_list
    )


def _cell_symbols(source, exported):
    "Names defined at the top level of an exported cell, in order, that the module exports (and public @patch methods)."
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_patch(node) and node.args.args:
            ann = node.args.args[0].annotation
            if isinstance(ann, ast.Name) and ann.id in exported and not node.name.startswith("_"):
                names.append(f"{ann.id}.{node.name}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return [n for n in names if n in exported or "." in n]


def _imports_only(source):
    try:
        return all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.parse(source).body)
    except SyntaxError:
        return False


def _resolve(mod, name):
    obj, owner = mod, None
    for part in name.split("."):
        owner, obj = obj, getattr(obj, part)
    return owner, obj


def _default_text(module, value) -> str:
    """A parameter's default as a signature shows it: the name of the module-level object it is (`table=ROUTES`, not
    the table), `object()` for a sentinel, else `_stable_repr` (no object addresses)."""
    if value is inspect.Parameter.empty: return ""
    if not isinstance(value, (int, float, str, bytes, type(None))):
        named = [k for k, v in vars(module).items() if v is value and not k.startswith("__")] if module else []
        if named: return named[0]
    return "object()" if type(value) is object else _stable_repr(value)


def _render_callable(obj, name, level):
    from unittest import mock

    from fastcore import docments
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    # fastcore formats every default through this one private function and offers no hook for it
    with mock.patch.object(docments, "_fmt_default", functools.partial(_default_text, module)):
        md = docments.MarkdownRenderer(obj, name=name)._repr_markdown_()
    if isinstance(obj, type):
        md = md.replace(f"def {obj.__name__}(", f"class {obj.__name__}(", 1)
    return f"{'#' * level} {name} {{ #{_anchor(name)} }}\n\n{md}"


def _render_dataclass(obj, name, level):
    "A dataclass as its own fields with defaults and help (from `field(metadata={'help': ...})` or docments)."
    import dataclasses
    import inspect

    from fastcore.docments import docments
    own = obj.__dict__.get("__annotations__", {})
    try:
        comments = docments(obj, full=False)
    except Exception:
        comments = {}
    lines = []
    for f in dataclasses.fields(obj):
        if f.name not in own:
            continue
        typ = f.type if isinstance(f.type, str) else inspect.formatannotation(f.type)
        default = _stable_repr(f.default) if f.default is not dataclasses.MISSING else (
            "<factory>" if f.default_factory is not dataclasses.MISSING else None)
        help_ = f.metadata.get("help") or comments.get(f.name)
        lines.append(
            f"    {f.name}: {typ}"
            + (f" = {default}" if default is not None else "")
            + (f"  # {help_}" if help_ else "")
        )
    bases = [b.__name__ for b in obj.__bases__ if b is not object]
    code = (
        f"@dataclass\nclass {obj.__name__}"
        + (f"({', '.join(bases)})" if bases else "")
        + ":\n"
        + ("\n".join(lines) or "    ...")
    )
    doc = inspect.getdoc(obj) or ""
    doc = "" if doc.startswith(f"{obj.__name__}(") else re.sub(r"^(\s*)(.+)", r"\1*\2*", doc, count=1)
    parent = next((b for b in obj.__mro__[1:] if dataclasses.is_dataclass(b)), None)
    more = f"\n\nEvery other field comes from `{parent.__name__}` ({parent.__module__})." if parent else ""
    return (
        f"{'#' * level} {name} {{ #{_anchor(name)} }}\n\n```python\n{code}\n```" + (f"\n\n{doc}" if doc else "") + more
    )


def _stable_repr(obj) -> str:
    """`repr` that two builds of one commit write alike: functions, classes and modules by their dotted names (not
    `<function f at 0x7f...>`), sets in sorted order, containers, dataclasses and named tuples field by field."""
    import dataclasses
    import types
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type)):
        return f"{obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if isinstance(obj, property):
        return f"property({_stable_repr(obj.fget)})"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{_stable_repr(k)}: {_stable_repr(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (set, frozenset)):
        items = ", ".join(sorted(_stable_repr(x) for x in obj))
        if not obj: return f"{type(obj).__name__}()"
        return f"{{{items}}}" if type(obj) is set else f"{type(obj).__name__}({{{items}}})"
    fields = None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and obj.__dataclass_params__.repr:
        fields = [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.repr]
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a NamedTuple
        fields = list(zip(obj._fields, obj))
    if fields is not None:
        return f"{type(obj).__name__}(" + ", ".join(f"{k}={_stable_repr(v)}" for k, v in fields) + ")"
    if type(obj) in (list, tuple):
        items = [_stable_repr(x) for x in obj]
        return f"[{', '.join(items)}]" if type(obj) is list else f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    return repr(obj)


def _render_value(obj, name, level):
    text = _stable_repr(obj)
    text = text if len(text) <= 400 else text[:400] + " ..."
    return f"{'#' * level} {name} {{ #{_anchor(name)} }}\n\n```python\n{name}: {type(obj).__name__} = {text}\n```"


def _in_body(fn, cls) -> bool:
    "Whether `fn` is written inside `cls`'s body (a method added later with `@patch` gets its own entry instead)."
    import inspect
    try:
        lines, start = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return True
    code = getattr(fn, "__code__", None)
    return code is None or start <= code.co_firstlineno < start + len(lines)


def _methods(cls, mod):
    "Public methods and properties defined in `cls`'s own body (inherited ones are documented upstream)."
    for k, v in vars(cls).items():
        if k.startswith("_"):
            continue
        fn = v.fget if isinstance(v, property) else getattr(v, "__func__", v)
        if callable(fn) and getattr(fn, "__module__", None) == mod.__name__ and _in_body(fn, cls):
            yield k, fn


def api_entry(mod, name):
    "Markdown for one exported symbol of `mod`: signature with docments, docstring, and its public methods."
    _, obj = _resolve(mod, name)
    level = 4 if "." in name else 3
    try:
        return _api_entry(mod, name, obj, level)
    except Exception as e:  # an object the renderers cannot take still gets its entry (and anchor), and a warning
        import logging
        logging.getLogger("adaptkit.docs").warning("API entry %s.%s: %s rendering it (%s); shown as its value",
                                                   mod.__name__, name, type(e).__name__, e)
        value = _render_value(obj, name, level)
        return f'<div class="api-entry" markdown>\n\n{value}\n\n({type(e).__name__} rendering it)\n\n</div>'


def _api_entry(mod, name, obj, level):
    from fastcore.docments import can_render
    if not callable(obj) or not can_render(obj):
        body = _render_value(obj, name, level)
    else:
        import dataclasses
        is_dc = isinstance(obj, type) and dataclasses.is_dataclass(obj)
        body = _render_dataclass(obj, name, level) if is_dc else _render_callable(obj, name, level)
        if isinstance(obj, type):
            body += "".join(
                "\n\n" + _render_callable(fn, f"{name}.{k}", 4) for k, fn in _methods(obj, mod) if can_render(fn)
            )
    return f'<div class="api-entry" markdown>\n\n{body}\n\n</div>'


# ---- pages ----------------------------------------------------------------------------------------------------------
class Page:
    "Renders one notebook to Markdown in the site's source tree `docs_dir`."

    def __init__(self, nb_path, docs_dir, pages, symbols):
        self.nb_path, self.nb = Path(nb_path), _read(nb_path)
        self.md_path, self.docs_dir, self.pages, self.symbols = (
            page_path(nb_path, self.nb),
            Path(docs_dir),
            pages,
            symbols,
        )
        self.n_files = 0

    def _asset(self, data, ext):
        "Write `data` beside the page and return its relative link."
        self.n_files += 1
        rel = self.md_path.with_suffix("").as_posix().replace("/", "_") + f"_files/out_{self.n_files}.{ext}"
        dst = self.docs_dir / "assets" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
        return _rel(Path("assets") / rel, self.md_path)

    def _fix_link(self, m):
        bang, text, target = m.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target, re.I):
            return m.group(0)
        path, _, frag = target.partition("#")
        src = (self.nb_path.parent / path).resolve()
        if src.suffix == ".ipynb" and src in self.pages:
            new = _rel(self.pages[src], self.md_path) + (f"#{frag}" if frag else "")
        elif src.is_file() and ROOT in src.parents and bang:
            new = self._asset(src.read_bytes(), src.suffix.lstrip("."))
        elif src.exists() and ROOT in src.parents:  # a repository file outside the site: link to it on the forge
            new = f"{_git_url()}/blob/main/{src.relative_to(ROOT).as_posix()}" + (f"#{frag}" if frag else "")
        else:
            return m.group(0)
        return f"{bang}[{text}]({new})"

    def _linkify(self, line):
        "`name` of an exported symbol -> a link to its API entry."
        def sub(m):
            here = self.symbols.get(f"{self.md_path.as_posix()}:{m.group(1)}")  # this page's own symbol first
            target = here or self.symbols.get(m.group(1))
            if not target:
                return m.group(0)
            page, anchor = target
            href = ("" if page == self.md_path else _rel(page, self.md_path)) + (f"#{anchor}" if anchor else "")
            if not href:
                return m.group(0)
            return f"[`{m.group(1)}`]({href})"
        return _tick.sub(sub, line)

    def markdown(self, source, attachments=None):
        for name, data in (attachments or {}).items():
            for mime, b64 in data.items():
                if mime in _IMAGES:
                    source = source.replace(
                        f"attachment:{name}", self._asset(base64.b64decode(_text(b64)), _IMAGES[mime])
                    )
        out, fence = [], False
        for line in source.splitlines():
            if line.lstrip().startswith("```"):
                fence = not fence
            out.append(line if fence else self._linkify(_link.sub(self._fix_link, line)))
        return "\n".join(out)

    def outputs(self, cell):
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "stream":
                if out.get("name") != "stderr" and _text(out["text"]).strip():
                    yield f"```text\n{_ansi.sub('', _text(out['text'])).rstrip()}\n```"
            elif kind == "error":
                yield f"```text\n{out.get('ename')}: {out.get('evalue')}\n```"
            else:
                data = out.get("data", {})
                if "text/markdown" in data:
                    yield _text(data["text/markdown"])
                elif mime := next((k for k in _IMAGES if k in data), None):
                    yield f"![output]({self._asset(base64.b64decode(_text(data[mime])), _IMAGES[mime])})"
                elif "image/svg+xml" in data:
                    yield f"![output]({self._asset(_text(data['image/svg+xml']).encode(), 'svg')})"
                elif "text/html" in data:
                    yield f'<div class="nb-output" markdown="0">\n{_text(data["text/html"]).strip()}\n</div>'
                elif "text/plain" in data:
                    yield f"```text\n{_ansi.sub('', _text(data['text/plain'])).rstrip()}\n```"

    def render(self, mod=None):
        exported = set(getattr(mod, "__all__", [])) if mod else set()
        parts, documented = [], set()
        for cell in self.nb["cells"]:
            directives, body = _split_directives(_text(cell["source"]))
            if _HIDE & set(directives) or not body.strip() and not cell.get("outputs"):
                continue
            if cell["cell_type"] == "markdown":
                parts.append(self.markdown(body, cell.get("attachments")))
                continue
            if cell["cell_type"] != "code":
                continue
            is_export = bool({"export", "exports"} & set(directives))
            names = [n for n in _cell_symbols(body, exported) if n not in documented] if is_export and mod else []
            parts += [api_entry(mod, n) for n in names]
            documented |= set(names)
            if "export" in directives and not _imports_only(body):
                # collapsed, as pymdownx.details' `??? abstract` renders it, and left out of the search index: the API
                # entry above is what a search should find (search_index.json 1.4 MB; 2.4 MB with the sources in it)
                parts.append('<details class="abstract" data-search-exclude markdown>\n'
                             f'<summary>Exported source</summary>\n\n```python\n{body}\n```\n\n</details>')
            elif "export" not in directives and "echo: false" not in directives and body.strip():
                parts.append(f"```python\n{body}\n```")
            if "output: false" not in directives:
                parts += list(self.outputs(cell))
        rest = [n for n in getattr(mod, "__all__", []) if n not in documented] if mod else []
        if rest:
            parts.append("## Other exports")
            parts += [api_entry(mod, n) for n in rest]
        return "\n\n".join(parts) + "\n"


def _git_url():
    m = re.search(r"^git_url\s*=\s*(\S+)", (ROOT / "settings.ini").read_text(), re.M)
    return m.group(1) if m else ""


def symbol_index(mods, pages):
    "exported name (bare and module-qualified) -> (page, anchor), for linking `name` in prose to its API entry."
    index, packages = {}, []
    for nb_path in mods:
        name = _default_exp(_read(nb_path))
        if not name:
            continue
        mod = importlib.import_module(f"adaptkit.{name}")
        index[f"adaptkit.{name}"] = (pages[nb_path.resolve()], "")
        if hasattr(mod, "__path__"):  # a package: its names link to the module that defines them
            packages.append((name, mod))
            continue
        for sym in getattr(mod, "__all__", []):
            index.setdefault(sym, (pages[nb_path.resolve()], _anchor(sym)))
            page = pages[nb_path.resolve()]
            index[f"{name}.{sym}"] = index[f"adaptkit.{name}.{sym}"] = index[f"{page.as_posix()}:{sym}"] = (
                page,
                _anchor(sym),
            )
    for name, mod in packages:
        for sym in mod.__all__:
            defined_in = getattr(getattr(mod, sym), "__module__", None) or ""
            if target := index.get(f"{defined_in}.{sym}"):
                index[f"{name}.{sym}"] = index[f"adaptkit.{name}.{sym}"] = target
    return index


def write_sources(docs_dir):
    "Render every notebook to Markdown under `docs_dir`; return the site's nav."
    docs_dir = Path(docs_dir)
    home, mods, tuts = notebooks()
    pages = {p.resolve(): page_path(p, _read(p)) for p in [home, *mods, *tuts]}
    symbols = symbol_index(mods, pages)
    nav = {"Methods": {}, "Hub": {}, "Core": [], "Tutorials": []}
    for nb_path in [home, *mods, *tuts]:
        page = Page(nb_path, docs_dir, pages, symbols)
        name = _default_exp(page.nb)
        mod = importlib.import_module(f"adaptkit.{name}") if name and nb_path in mods else None
        dst = docs_dir / page.md_path
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(page.render(mod), encoding="utf-8")
        title = _title(page.nb, nb_path.stem)
        if nb_path in mods:
            section, package = _section(nb_path)
            entry = {f"adaptkit.{name}" if name.split(".")[-1] == title else title: page.md_path.as_posix()}
            if package is None: nav[section].append(entry)
            else: nav[section].setdefault(f"adaptkit.{package}", []).append(entry)
        elif nb_path in tuts:
            nav["Tutorials"].append({title: page.md_path.as_posix()})
    (docs_dir / "assets").mkdir(exist_ok=True)
    shutil.copy(ROOT / "docs" / "adaptkit.css", docs_dir / "assets" / "adaptkit.css")
    nav["Methods"], nav["Hub"] = ([{k: v} for k, v in nav[s].items()] for s in ("Methods", "Hub"))
    return [{"Home": "index.md"}] + [{k: v} for k, v in nav.items() if v]


@contextlib.contextmanager
def _source_found_once():
    """`inspect.findsource` remembered per object while the sources are written: the API entries ask for a class's
    source once per method (`_in_body`) and again in fastcore's docments, and each time Python re-parses the class's
    whole module to find it (without this the build took 46 s instead of 31). The site is built in one pass over
    files that do not change."""
    import inspect
    findsource = inspect.findsource
    inspect.findsource = functools.lru_cache(maxsize=None)(findsource)
    try: yield
    finally: inspect.findsource = findsource


@contextlib.contextmanager
def _annotations_as_written():
    """fastcore renders a signature with its annotations evaluated (`inspect.signature(eval_str=True)`), which raises
    NameError for a string annotation naming a type imported only for type checkers (`push_folder`, `render_card`,
    `tiny_causal_lm`, ...); those entries fell back to the object's repr. Meanwhile such a signature keeps its
    annotations as written."""
    import inspect

    import fastcore.docments as docments
    def signature(obj, *args, eval_str=False, **kwargs):
        try: return inspect.signature(obj, *args, eval_str=eval_str, **kwargs)
        except NameError: return inspect.signature(obj, *args, eval_str=False, **kwargs)
    saved, docments.signature = docments.signature, signature
    try: yield
    finally: docments.signature = saved


def build(out=ROOT / "_docs"):
    "Build the whole site into `out` (replaced) and return its folder."
    import logging

    from mkdocs.commands.build import build as mkdocs_build
    from mkdocs.config import load_config
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    out = Path(out).resolve()
    with tempfile.TemporaryDirectory(prefix="adaptkit-docs-") as tmp:
        with _source_found_once(), _annotations_as_written(): nav = write_sources(tmp)
        cfg = load_config(str(ROOT / "docs" / "mkdocs.yml"), docs_dir=tmp, site_dir=str(out), nav=nav)
        mkdocs_build(cfg)
    return out


def main(argv=sys.argv[1:]):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "_docs"), help="site folder (replaced)")
    args = ap.parse_args(argv)
    t0 = time.time()
    out = build(args.out)
    print(f"docs: built {out} in {time.time() - t0:.1f}s; open {out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

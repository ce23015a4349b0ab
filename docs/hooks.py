"""MkDocs hooks (`hooks:` in mkdocs.yml): the pages that must not drift from the code are generated at build time.

- `reference/api/...`: one page per public module of tfdml (one per submodule of a package, so a loss family
  is one page), rendered by mkdocstrings from the docstrings; a package's page lists its public names with
  links to where each is defined. New modules get pages and a nav entry without editing mkdocs.yml.
- `reference/cli.md`: every `tfdml` command and option, from the argparse parsers of `tfdml.cli`.
- `reference/configuration.md`: every configuration key, from the typed dataclasses of `tfdml.config` (type,
  default, the main job's value, allowed values, and the comment the dataclass gives the field).
- The committed benchmark plots (`benchmarks/**/*.png`) are added to the site at the same paths, so that a
  page under `docs/benchmarks/<name>/` shows them, and the tables come in through `pymdownx.snippets`.
- Equations written `$...$` / `$$...$$` (pymdownx.arithmatex, generic mode) become MathML at build time
  (latex2mathml), which browsers render natively: nothing is fetched when the site is built or viewed.

- `<!-- generated: NAME -->` in a page becomes a table written at build time: a benchmark's results
  (`ala_drift`) or the losses' declared arguments (`loss_arguments`, in the losses guide).

`python docs/hooks.py cli|configuration|api|NAME` prints a generated page or table (for a look without building).
"""

import argparse
import dataclasses
import html
import inspect
import os
import re
import sys
import types
import typing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # this checkout's tfdml, also when another one is installed

PACKAGE = "tfdml"
API_DIR = "reference/api"
# Modules the library uses internally: importable, but not API a user programs against, so not in the reference.
INTERNAL_MODULES = {"interrupts", "keras_private", "locks"}

# --------------------------------------------------------------------------------------------------- modules


def public_modules():
    """`{top-level module: [its submodules]}` of tfdml, read from the file system (no import): every module or
    package whose name does not start with `_` and is not internal; a plain module has no submodules."""
    modules = {}
    folder = os.path.join(ROOT, PACKAGE)
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if entry.startswith("_") or entry.removesuffix(".py") in INTERNAL_MODULES:
            continue
        if entry.endswith(".py"):
            modules[entry[:-3]] = []
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            modules[entry] = sorted(
                name[:-3] if name.endswith(".py") else name  # a sub-package (models.ala): one page, its __all__
                for name in os.listdir(path)
                if not name.startswith("_")
                and (name.endswith(".py") or os.path.isfile(os.path.join(path, name, "__init__.py")))
            )
    return modules


def _submodule_page(module, sub):
    """The page of `tfdml.<module>.<sub>`. A page named `index.md` (or `README.md`) would be the folder's own
    page, the URL of the package's page `<module>.md` (`retrieval.index`): it gets a `-module` suffix."""
    name = f"{sub}-module" if sub.lower() in ("index", "readme") else sub
    return f"{API_DIR}/{module}/{name}.md"


def api_pages():
    """`{page path: title}` of the API reference, in nav order."""
    pages = {}
    for module, submodules in public_modules().items():
        pages[f"{API_DIR}/{module}.md"] = f"{PACKAGE}.{module}"
        for sub in submodules:
            pages[_submodule_page(module, sub)] = f"{PACKAGE}.{module}.{sub}"
    return pages


# The site search ranks a page by its words, a title 1000 times a word of the text, so a module named
# `tfdml.losses.triplet` would answer "triplet" ahead of the losses guide. The API pages weigh less than the
# guides (`API_SEARCH_BOOST`), and the pages of the losses' shared building blocks (distances, masks, mining:
# `SEARCH_EXCLUDED`) are left out; every name is still found, after the guides.
API_SEARCH_BOOST = 0.01  # a title match there (x1000) then counts less than a word of a guide (x10)
SEARCH_EXCLUDED = ("ops",)


def search_front_matter(path):
    """The front matter of a generated API page: out of the search for a package of `SEARCH_EXCLUDED`, else
    weighed at `API_SEARCH_BOOST`."""
    package = api_pages().get(path, "").split(".")[1:2]
    if package and package[0] in SEARCH_EXCLUDED:
        return "---\nsearch:\n  exclude: true\n---\n"
    return f"---\nsearch:\n  boost: {API_SEARCH_BOOST}\n---\n"


def check_one_source_per_url(files):
    """Two source files that MkDocs maps to one URL (`a.md` and `a/index.md`) make one page silently replace
    the other; the build stops and names them instead."""
    by_url = {}
    for file in files:
        if file.is_documentation_page():
            by_url.setdefault(file.url, []).append(file.src_uri)
    clashes = {url: sources for url, sources in by_url.items() if len(sources) > 1}
    if clashes:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"pages that share one URL (one would hide the other): {clashes}")


def griffe_package():
    import griffe  # the docs extra (mkdocstrings' Python handler)

    return griffe.load(PACKAGE, search_paths=[ROOT], resolve_aliases=False)


def public_names(module):
    """`{name: path of its definition}` of a griffe module: `__all__` when it has one, otherwise every name
    without a leading `_` that the module defines or imports from tfdml (submodules left out)."""
    names = {}
    exports = module.exports
    for name, member in module.members.items():
        if exports is not None and name not in exports:
            continue
        if exports is None and name.startswith("_"):
            continue
        target = member.target_path if member.is_alias else member.path
        if not target.startswith(f"{PACKAGE}.") or (not member.is_alias and member.is_module):
            continue
        if member.is_alias and target == f"{module.path}.{name}" and name in module.modules:
            continue  # a submodule reached through its package
        if target.split(".")[1] in INTERNAL_MODULES:
            continue  # an internal module's name used here (tfdml.locks.LockedError in tfdml.cli)
        names[name] = target
    return names


def _first_line(docstring):
    return docstring.value.strip().split("\n\n")[0].replace("\n", " ") if docstring else ""


def _summary(package, target):
    """The first sentence of the docstring of `target` (a dotted path in tfdml), for one table row."""
    try:
        text = _first_line(package[target.split(".", 1)[1]].docstring)
    except KeyError:
        return ""
    sentence = re.split(r"(?<=[a-z0-9)`])\. (?=[A-Z`(])", text, maxsplit=1)[0]
    return sentence.replace("|", "\\|")


def api_page(path, package=None):
    """The Markdown of one API page."""
    package = package or griffe_package()
    if path == f"{API_DIR}/index.md":
        lines = [
            "# API reference",
            "",
            "Generated from the docstrings of every public module (`docs/hooks.py`). Each package's page lists the",
            "names it exports; each module has a page of its own.",
            "",
            "| module | |",
            "|---|---|",
        ]
        for page, title in api_pages().items():
            module = package[title.split(".", 1)[1]]
            link = os.path.relpath(page, API_DIR)
            lines.append(f"| [`{title}`]({link}) | {_first_line(module.docstring)} |")
        return "\n".join(lines) + "\n"
    title = api_pages()[path]
    module = package[title.split(".", 1)[1]]
    if not public_modules().get(title.split(".", 1)[1]):
        return f"# `{title}`\n\n::: {title}\n    options:\n      show_root_heading: false\n"
    own = [name for name, target in public_names(module).items() if target == f"{title}.{name}"]
    lines = [
        f"# `{title}`",
        "",
        f"::: {title}",
        "    options:",
        "      show_root_heading: false",
        f"      members: [{', '.join(own)}]" if own else "      members: false",
        "",
        "## Public names",
        "",
        "| name | defined in | what it is |",
        "|---|---|---|",
    ]
    for name, target in sorted(public_names(module).items(), key=lambda item: item[0].lower()):
        lines.append(f"| [`{name}`][{target}] | `{target.rsplit('.', 1)[0]}` | {_summary(package, target)} |")
    lines += ["", "## Modules", ""]
    for sub in public_modules()[title.split(".", 1)[1]]:
        link = os.path.relpath(_submodule_page(module.name, sub), API_DIR)
        lines.append(f"- [`{title}.{sub}`]({link}): {_first_line(module[sub].docstring)}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- the CLI


def _option_text(action):
    names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.option_strings and action.nargs != 0:
        metavar = action.metavar or action.dest.upper()
        if isinstance(metavar, tuple):
            metavar = " ".join(metavar)
        names += f" `{metavar}`"
    return names


def _help_text(action, formatter):
    text = formatter._get_help_string(action) or ""  # the command's own rule for showing defaults
    params = {**vars(action), "prog": "tfdml"}
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(choice) for choice in params["choices"])
    text = text % params if "%(" in text else text
    text = html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")
    # an option named in the help is code, kept whole in its cell ("--expansion-alpha", not "-" "-expansion-alpha")
    return re.sub(r"(?<![\w`-])(--[a-z][\w-]*)", r"`\1`", text)


def cli_page():
    """Every `tfdml` command with its usage and options, from `tfdml.cli.build_parser()`."""
    from tfdml.cli import build_parser

    parser = build_parser()
    lines = [
        "# Command line",
        "",
        "Generated from the argparse definitions of `tfdml.cli` (`docs/hooks.py`), so it lists what",
        "`tfdml COMMAND --help` prints. The [command-line guide](../guides/command-line.md) shows the commands at",
        "work; [configuration keys](configuration.md) lists what `--set key=value` accepts.",
        "",
        "```text",
        parser.format_usage().strip(),
        "```",
        "",
        parser.description or "",
        "",
    ]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in subparsers._choices_actions}
    for name, sub in subparsers.choices.items():
        formatter = sub._get_formatter()
        lines += [f"## `tfdml {name}`", "", helps.get(name) or "", ""]
        if sub.description and not sub.description.startswith(helps.get(name) or "\0"):
            lines += [html.escape(sub.description, quote=False), ""]
        elif sub.description:
            lines[-2] = html.escape(sub.description, quote=False)
        lines += ["```text", sub.format_usage().strip(), "```", ""]
        for group in sub._action_groups:
            actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
            if not actions:
                continue
            lines += [f"**{group.title}**", "", "| option | what it does |", "|---|---|"]
            lines += [f"| {_option_text(a)} | {_help_text(a, formatter)} |" for a in actions]
            lines.append("")
        if sub.epilog:
            lines += ["```text", sub.epilog.strip(), "```", ""]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- configuration keys


def _type_text(tp):
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        text = " or ".join(_type_text(a) for a in inner)
        return f"{text} or null" if len(inner) < len(args) else text
    if origin in (list, tuple):
        return f"list of {_type_text(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping {_type_text(args[0])} → {_type_text(args[1])}" if args else "mapping"
    if tp is typing.Any:
        return "any"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _value_text(value):
    import yaml

    if dataclasses.is_dataclass(value):
        return "(section)"
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    text = text[: -len("...")].strip() if text.endswith("...") else text
    return f"`{text}`"


def _rules(field):
    rules = []
    meta = field.metadata or {}
    if meta.get("choices"):
        rules.append("one of " + ", ".join(f"`{c}`" for c in meta["choices"]))
    if meta.get("minimum") is not None:
        rules.append(f"≥ {meta['minimum']}")
    if meta.get("above") is not None:
        rules.append(f"> {meta['above']}")
    return "; ".join(rules)


def _default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def configuration_page(package=None):
    """Every key of `tfdml.config.Config`, section by section, and the loss classes `loss.name` names."""
    from tfdml import config as config_lib
    from tfdml.config import descriptions

    job = config_lib.DEFAULT_JOB  # plain data: checking it with the library would import TensorFlow
    lines = [
        "# Configuration keys",
        "",
        "Generated from the typed configuration (`tfdml.config.Config` and its sections, `docs/hooks.py`): each",
        "key with its type, the default of the dataclass, the value in the main job (`tfdml train` with no",
        "options, `configs/glyphs_rll.yaml`; blank where it keeps the default), what it accepts and what it does.",
        "Set one with `--set section.key=value` (a YAML value) or in a `--config` file; the",
        "[configuration guide](../guides/configuration.md) explains how the layers combine.",
        "",
    ]

    def section(cls, prefix, value):
        comments = descriptions.field_comments(cls)  # what --print-config prints as comments too
        hints = typing.get_type_hints(cls)
        rows, children = [], []
        for field in dataclasses.fields(cls):
            if field.name.startswith("_"):
                continue
            key = f"{prefix}{field.name}"
            child = descriptions.section_class(hints[field.name])
            default = _default(field)
            current = value.get(field.name, {} if child else default)
            in_job = "" if current == default or child else _value_text(current)
            what = html.escape(comments.get(field.name, ""), quote=False).replace("|", "\\|")
            if child:
                what = (what + " " if what else "") + f"See [`{key}`](#{key.replace('.', '')})."
                children.append((child, f"{key}.", current))
            rows.append(
                f"| `{key}` | {_type_text(hints[field.name])} | {_value_text(default)} | {in_job} | "
                f"{_rules(field)} | {what} |"
            )
        title = prefix.rstrip(".") or "top level"
        doc = inspect.getdoc(cls) or ""
        doc = "" if doc.startswith(f"{cls.__name__}(") else doc  # dataclasses' generated signature
        lines.extend([f"## `{title}`" if prefix else "## Top level", "", html.escape(doc, quote=False), ""])
        lines.extend(["| key | type | default | main job | accepts | what it does |", "|---|---|---|---|---|---|"])
        lines.extend(rows)
        lines.append("")
        for child, child_prefix, child_value in children:
            section(child, child_prefix, child_value)

    section(config_lib.Config, "", job)
    lines += _loss_names_section(package)
    return "\n".join(lines) + "\n"


def _loss_names_section(package=None):
    """`loss.name` -> its class, linked to the class's reference page where `loss.params` are documented."""
    from tfdml.loss_names import LOSSES

    losses = (package or griffe_package())["losses"]
    lines = [
        "## `loss.name` and `loss.params`",
        "",
        "`loss.params` are the arguments of the class `loss.name` names (checked against its constructor before",
        "anything is built; changing `loss.name` starts `loss.params` from that class's defaults):",
        "",
        "| `loss.name` | class (its arguments) |",
        "|---|---|",
    ]
    for name, class_name in LOSSES.items():
        lines.append(f"| `{name}` | [`{class_name}`][{losses[class_name].target_path}] |")
    return [*lines, ""]


# --------------------------------------------------------------------------------------------------- math


def _mathml(tex, display):
    import latex2mathml.converter

    return latex2mathml.converter.convert(html.unescape(tex), display="block" if display else "inline")


_MATH = re.compile(
    r'<(?P<tag>span|div) class="arithmatex">\s*(?:\\\((?P<inline>.*?)\\\)|\\\[(?P<block>.*?)\\\])\s*</(?P=tag)>',
    re.S,
)


def typeset(content):
    """arithmatex's generic output (`\\(...\\)` and `\\[...\\]` in spans and divs) as MathML."""

    def replace(match):
        if match.group("inline") is not None:
            return _mathml(match.group("inline"), display=False)
        return f'<div class="math-block">{_mathml(match.group("block"), display=True)}</div>'

    return _MATH.sub(replace, content)


# ---------------------------------------------------------------------------------------------- MkDocs hooks


def on_config(config):
    """The API section of the nav: one entry per generated page (modules added later appear on their own)."""
    pages = api_pages()

    def expand(items):
        for i, item in enumerate(items):
            if isinstance(item, dict):
                ((title, value),) = item.items()
                if value == f"{API_DIR}/index.md":
                    items[i] = {title: [value, *_api_nav(pages)]}
                elif isinstance(value, list):
                    expand(value)

    expand(config["nav"])
    return config


def _api_nav(pages):
    nav, sections = [], {}
    packages = {name for name, submodules in public_modules().items() if submodules}
    for path, title in pages.items():
        parts = title.split(".")
        if len(parts) == 3:
            sections[parts[1]].append({parts[2]: path})
        elif parts[1] in packages:
            sections[parts[1]] = [{"overview": path}]
            nav.append({title: sections[parts[1]]})
        else:
            nav.append({title: path})
    return nav


def on_files(files, config):
    from mkdocs.structure.files import File

    package = griffe_package()
    generated = {f"{API_DIR}/index.md": None, **api_pages(), "reference/cli.md": None}
    for path in generated:
        content = search_front_matter(path) + api_page(path, package) if "api" in path else cli_page()
        files.append(File.generated(config, path, content=content))
    files.append(File.generated(config, "reference/configuration.md", content=configuration_page(package)))
    for folder, _, names in os.walk(os.path.join(ROOT, "benchmarks")):
        for name in sorted(names):
            if name.endswith((".png", ".svg")):
                path = os.path.relpath(os.path.join(folder, name), ROOT)
                files.append(File(path, ROOT, config["site_dir"], config["use_directory_urls"]))
    check_one_source_per_url(files)
    return files


# ------------------------------------------------------------------------------------ generated tables


_DRIFT_RUNS = {
    "": "default: positive pairs, one state per step, `weight_range=1`",
    "rangeinf": "default with unbounded logits (`weight_range=inf`)",
    "per_tuple_all": "the paper's recurrence over every pair, unbounded",
    "range2_per_tuple_all": "the paper's recurrence over every pair, `weight_range=2`",
}
_DRIFT_FILE = re.compile(r"drift_noise[0-9.]+(?:_(?!seed)(.+?))?(?:_seed(\d+))?\.jsonl$")


def _drift_run(name):
    """What a drift run's file name says: its options (`--tag`) and its seed."""
    tag, seed = _DRIFT_FILE.match(name).groups()
    tag = tag or ""
    if tag.startswith("penalty"):
        what = f"default with `output_penalty={tag[len('penalty') :]}`"
    else:  # a tag not described here is shown as it is, not a failed build
        what = _DRIFT_RUNS.get(tag, f"`--tag {tag}`")
    return f"{what}, seed {seed or 0}"


def ala_drift_table():
    """The weight-drift benchmark's table, from `benchmarks/ala_drift/summary.json` (one JSON line per run)."""
    import json

    with open(os.path.join(ROOT, "benchmarks", "ala_drift", "summary.json")) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    lines = [
        "| run | finite | output spread: first → last tenth (max) | trend / 1,000 steps ± SE: whole run; after"
        " step 1,000 | largest weight: last tenth (max) | smallest weight: last tenth | saturated LSTM units: last"
        " tenth (max) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        name = run["file"].rsplit("/", 1)[-1]
        spread, top, low, sat = (
            run[k] for k in ("output_std", "probe_weight_max", "probe_weight_min", "state_h_saturated")
        )
        slope, error = "output_std_trend_per_1000_steps", "output_std_trend_standard_error"
        trend = "; ".join(f"{run[slope + part]:+.3f} ± {run[error + part]:.3f}" for part in ("", "_after_1000"))
        lines.append(
            f"| {_drift_run(name)} (`{name}`) | {'yes' if run['all_finite'] else '**no**'} | "
            f"{spread['first_tenth']:.2f} → {spread['last_tenth']:.2f} ({spread['max']:.1f}) | {trend} | "
            f"{top['last_tenth']:.2f} ({top['max']:.1f}) | {low['last_tenth']:.2f} | "
            f"{100 * sat['last_tenth']:.0f} % ({100 * sat['max']:.0f} %) |"
        )
    return "\n".join(lines) + "\n"


def _argument_default(argument):
    from tfdml.losses.arguments import REQUIRED

    if argument.default is REQUIRED:
        return "(required)"
    return f"`{argument.default!r}`".replace("'", '"')


def _argument_accepts(argument):
    if argument.choices is not None:
        return ", ".join(f'`"{choice}"`' for choice in argument.choices)
    if argument.range():
        return f"`{argument.range_text()}`"
    return "true or false" if isinstance(argument.default, bool) else ""


def loss_arguments_table():
    """Every configurable loss's arguments, from the declarations (`tfdml.losses.arguments`): the class, each
    argument's default, what it accepts and what it is. The classes' `__init__`, `get_config`, pure functions
    and the configuration's `loss.params` read the same declarations."""
    from tfdml import losses
    from tfdml.loss_names import LOSSES

    lines = ["| `loss.name`: class | argument | default | accepts | what it is |", "|---|---|---|---|---|"]
    for name, class_name in LOSSES.items():
        for i, argument in enumerate(getattr(losses, class_name).ARGUMENTS):
            owner = f"`{name}`: `{class_name}`" if i == 0 else ""
            what = html.escape(argument.doc, quote=False).replace("|", "\\|")
            lines.append(
                f"| {owner} | `{argument.name}` | {_argument_default(argument)} | {_argument_accepts(argument)} | "
                f"{what} |"
            )
    return "\n".join(lines) + "\n"


GENERATED_TABLES = {"ala_drift": ala_drift_table, "loss_arguments": loss_arguments_table}
_GENERATED = re.compile(r"^<!-- generated: (\w+) -->$", re.M)


def on_page_markdown(markdown, page, config, files):
    """`<!-- generated: NAME -->` on a line of its own becomes the table `GENERATED_TABLES[NAME]` writes (from a
    benchmark's results file, or from the code)."""
    return _GENERATED.sub(lambda match: GENERATED_TABLES[match.group(1)](), markdown)


_INLINE_CODE = re.compile(r"<code>([^<\n]{24,})</code>")


def break_points(content):
    """Long inline code (`ala.episode.val_fraction`, `tfdml.retrieval.index`) may break after a dot, an underscore
    or a slash (`<wbr>`) and nowhere else: each piece between those points is a `<span class="nw">`, which the
    stylesheet keeps on one line, so that a narrow table cell wraps it there instead of mid-word or overflowing."""

    def add(match):
        pieces = re.split(r"(?<=[._/])(?=\w)", match.group(1))
        return "<code>" + "<wbr>".join(f'<span class="nw">{piece}</span>' for piece in pieces) + "</code>"

    return _INLINE_CODE.sub(add, content)


def on_page_content(html_text, page, config, files):
    return break_points(typeset(html_text))


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "cli"
    if what == "cli":
        print(cli_page())
    elif what == "configuration":
        print(configuration_page())
    elif what in GENERATED_TABLES:
        print(GENERATED_TABLES[what]())
    else:
        print(api_page(f"{API_DIR}/{what}" if what.endswith(".md") else f"{API_DIR}/index.md"))

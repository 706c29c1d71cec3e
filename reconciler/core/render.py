"""Plan -> terminal text, Markdown (a pull-request comment) or JSON. Pure string building.

Coloured text (`color=True`) is written to the terminal as is, past the CLI's escaping of control characters
(cli/console.py), so it makes every line terminal-safe itself before painting it; plain text is escaped where it
is printed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from reconciler.core.plan import Action, AppPlan, ClusterPlan, FieldChange, Plan, describe_step
from reconciler.terminal import terminal_safe

_SYMBOL = {
    Action.CREATE: "+", Action.DELETE: "-", Action.NOOP: "=", Action.BLOCKED: "!", Action.ERROR: "x",
}
_COLOR = {"+": "32", "-": "31", "~": "33", "!": "35", "x": "31", "=": "2"}
_ORDER = [Action.ERROR, Action.BLOCKED, Action.DELETE, Action.TAKEOVER, Action.UPGRADE, Action.RESTART, Action.REPAIR,
          Action.SUSPEND, Action.RESUME, Action.SCALE, Action.CREATE, Action.NOOP]


def summary(plan: Plan) -> str:
    """e.g. '3 apps: 1 upgrade (savepoint), 1 create, 1 unchanged'."""
    counts: Counter[str] = Counter()
    for a in plan.apps:
        label = "unchanged" if a.action is Action.NOOP else a.action.value
        if a.action in (Action.UPGRADE, Action.RESTART) and a.upgrade_mode:
            label += f" ({a.upgrade_mode})"
        counts[label] += 1
    order = {a.value: i for i, a in enumerate(_ORDER)} | {"unchanged": len(_ORDER)}
    parts = sorted(counts.items(), key=lambda kv: (order.get(kv[0].split(" ")[0], 99), kv[0]))
    n = len(plan.apps)
    body = ", ".join(f"{c} {label}" for label, c in parts) or "nothing to do"
    return f"{n} app{'s' if n != 1 else ''}: {body}"


def _symbol(a: AppPlan) -> str:
    return _SYMBOL.get(a.action, "~")


def _sorted(plan: Plan) -> list[AppPlan]:
    rank = {a: i for i, a in enumerate(_ORDER)}
    return sorted(plan.apps, key=lambda a: (rank[a.action], a.app))


def _value(v: Any) -> str:
    return json.dumps(v, sort_keys=True) if not isinstance(v, str) else v


def diff_lines(changes: tuple[FieldChange, ...]) -> list[str]:
    out: list[str] = []
    for c in changes:
        tag = f"  ({c.change_class.label})"
        if c.op in ("remove", "replace"):
            out.append(f"- {c.path}: {_value(c.old)}" + ("" if c.op == "replace" else tag))
        if c.op in ("add", "replace"):
            out.append(f"+ {c.path}: {_value(c.new)}{tag}")
    return out


def _painter(color: bool) -> tuple[Callable[[str, str], str], Callable[[str], str]]:
    """(paint, safe) for one rendering: with colour, each piece is made terminal-safe before its escapes are
    added (the caller writes the result past the console's escaping); without, both leave text as it is."""
    if not color:
        return (lambda _code, s: s), (lambda s: s)
    return (lambda code, s: f"\x1b[{code}m{terminal_safe(s)}\x1b[0m"), terminal_safe


def _header(plan: Plan) -> str:
    rev = plan.revision[:12]
    base = f" against {plan.base_revision[:12]}" if plan.base_revision else ""
    return f"Plan for {rev}{base} ({plan.mode})"


def to_text(plan: Plan, *, color: bool = False) -> str:
    paint, _ = _painter(color)  # the header and summary are ours; the guard is painted

    lines = [paint("1", _header(plan)), summary(plan), ""]
    if plan.guard:
        lines += [paint("35;1", "GUARD: " + plan.guard), ""]
    for a in _sorted(plan):
        lines += app_lines(a, color=color)
    for c in _sorted_clusters(plan):
        lines += cluster_lines(c, color=color)
    return "\n".join(lines).rstrip() + "\n"


def head_lines(plan: Plan) -> list[str]:
    """The plan's header, summary and guard, as `to_text` starts (the dashboard's /plan shows the apps a page
    at a time below them)."""
    lines = [_header(plan), summary(plan)]
    return [*lines, "GUARD: " + plan.guard] if plan.guard else lines


def sorted_apps(plan: Plan) -> list[AppPlan]:
    """The apps in `to_text`'s order: what needs a person first, then by name."""
    return _sorted(plan)


def sorted_clusters(plan: Plan) -> list[ClusterPlan]:
    return _sorted_clusters(plan)


def app_lines(a: AppPlan, *, color: bool = False) -> list[str]:
    """One app's block of `to_text`: its head line, then its reason, risks, diff and steps (indented)."""
    paint, safe = _painter(color)

    sym = _symbol(a)
    mode = f" ({a.upgrade_mode})" if a.action in (Action.UPGRADE, Action.RESTART) and a.upgrade_mode else ""
    src = f"  {a.source_file}" if a.source_file else ""
    lines = [paint(_COLOR.get(sym, "0"), f"{sym} {a.app}: {a.action.value}{mode}") + paint("2", src),
             f"    {safe(a.reason)}"]
    for r in a.risks:
        lines.append("    " + paint("31;1", "RISK: " + r))
    if a.action is not Action.NOOP or a.diff:
        for d in diff_lines(a.diff):
            lines.append("    " + paint("32" if d.startswith("+") else "31", d))
    for i, s in enumerate(a.steps, 1):
        lines.append(f"    {i}. {safe(describe_step(s))}  (deadline {s.deadline_s:g}s)")
    if a.rollback:
        lines.append(f"    if a step after {a.rollback_after + 1 if a.rollback_after is not None else 0} "
                     "fails, roll back:")
        for i, s in enumerate(a.rollback, 1):
            lines.append(f"      r{i}. {safe(describe_step(s))}")
    if a.abort:
        lines.append(f"    if a step up to {(a.rollback_after or 0) + 1} fails, undo (the old job keeps running):")
        for i, s in enumerate(a.abort, 1):
            lines.append(f"      u{i}. {safe(describe_step(s))}")
    return lines


def cluster_lines(c: ClusterPlan, *, color: bool = False) -> list[str]:
    """One session cluster's block of `to_text`."""
    paint, safe = _painter(color)

    sym = _SYMBOL.get(c.action, "~")
    src = f"  {c.source_file}" if c.source_file else ""
    lines = [paint(_COLOR.get(sym, "0"), f"{sym} {c.cluster}: {c.action.value} (session cluster)") + paint("2", src),
             f"    {safe(c.reason)}"]
    for r in c.risks:
        lines.append("    " + paint("31;1", "RISK: " + r))
    if c.apps:
        lines.append(f"    apps: {safe(', '.join(c.apps))}")
    for i, s in enumerate(c.steps, 1):
        lines.append(f"    {i}. {safe(describe_step(s))}, after its apps' steps  (deadline {s.deadline_s:g}s)")
    return lines


def _sorted_clusters(plan: Plan) -> list[ClusterPlan]:
    rank = {a: i for i, a in enumerate(_ORDER)}
    return sorted(plan.clusters, key=lambda c: (rank[c.action], c.cluster))


def to_markdown(plan: Plan) -> str:
    """A pull-request comment: summary, risks in bold up top, one collapsible section per app."""
    lines = [f"### flink-reconciler: {_header(plan)}", "", f"**{summary(plan)}**", ""]
    risks = [(a.app, r) for a in plan.apps for r in a.risks]
    blocked = [a for a in plan.apps if a.action in (Action.BLOCKED, Action.ERROR)]
    if plan.guard or risks or blocked:
        lines.append("> [!WARNING]")
        if plan.guard:
            lines.append(f"> **{_md(plan.guard)}**")
        for app, r in risks:
            lines.append(f"> - **`{app}`: {_md(r)}**")
        for a in blocked:
            lines.append(f"> - **`{a.app}` {a.action.value}**: {_md(a.reason)}")
        lines.append("")
    unchanged = []
    for a in _sorted(plan):
        if a.action is Action.NOOP and not a.diff:
            unchanged.append(a.app)
            continue
        mode = f" ({a.upgrade_mode})" if a.action in (Action.UPGRADE, Action.RESTART) and a.upgrade_mode else ""
        lines += ["<details>", f"<summary><code>{_symbol(a)}</code> <b>{a.app}</b>: {a.action.value}{mode}"
                  f" — {_html(a.reason)}</summary>", ""]
        if a.source_file:
            lines += [f"File: `{a.source_file}`", ""]
        if a.diff:
            lines += ["```diff", *diff_lines(a.diff), "```", ""]
        if a.steps:
            lines += ["Steps:", ""]
            lines += [f"{i}. {_md(describe_step(s))} _(deadline {s.deadline_s:g}s)_" for i, s in enumerate(a.steps, 1)]
            lines.append("")
        if a.rollback:
            after = (a.rollback_after or 0) + 1
            lines += [f"If a step after step {after} fails, roll back:", ""]
            lines += [f"{i}. {_md(describe_step(s))}" for i, s in enumerate(a.rollback, 1)]
            lines.append("")
        if a.abort:
            upto = (a.rollback_after or 0) + 1
            lines += [f"If a step up to step {upto} fails, undo (the old job keeps running):", ""]
            lines += [f"{i}. {_md(describe_step(s))}" for i, s in enumerate(a.abort, 1)]
            lines.append("")
        lines += ["</details>", ""]
    if unchanged:
        lines.append(f"Unchanged: {', '.join(f'`{n}`' for n in unchanged)}")
    if plan.clusters:
        lines += ["", "Session clusters:", ""]
        lines += [f"- `{_SYMBOL.get(c.action, '~')}` **{c.cluster}**: {c.action.value} — {_md(c.reason)}"
                  + (f" (apps: {', '.join(c.apps)})" if c.apps else "")
                  + "".join(f" **RISK: {_md(r)}**" for r in c.risks) for c in _sorted_clusters(plan)]
    return "\n".join(lines).rstrip() + "\n"


def to_json(plan: Plan) -> str:
    return plan.to_json() + "\n"


def _md(s: str) -> str:
    return s.replace("*", "\\*").replace("_", "\\_")


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

"""`ampscope alerts …` (`cli.py` parses; these run): rules, destinations, tests, history.

    ampscope alerts rules [--project P]
    ampscope alerts add-rule --project P --name N (--finding KIND|any | --series METRIC
                             [--threshold X] [--window N] | --state crashed|stalled|finished
                             [--stall-factor F] [--stall-min-s S]) [--severity S] [--cooldown-s S]
    ampscope alerts enable|disable|delete-rule RULE
    ampscope alerts destinations [--project P]
    ampscope alerts add-destination --project P --name N --kind slack|discord|webhook
                             --url-file FILE|- [--min-severity S]
    ampscope alerts delete-destination ID
    ampscope alerts test ID
    ampscope alerts history [--project P] [--run RUN] [--limit N]

Like `token`, these work on the database directly as an operator with every project's rights.
A webhook URL is read from a file or stdin, never from the command line (where `ps` and shell
history would keep it); a generic webhook's signing secret is printed once, alone on stdout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from ampscope_server.access.principal import Principal, Scope, Via
from ampscope_server.alerts.schemas import FindingCondition, RuleRead, SeriesCondition
from ampscope_server.cli.admin import EXIT_USAGE, session_for, table, when
from ampscope_server.config import DB_HELP, Settings

OPERATOR = Principal(scope=Scope.ADMIN, project=None, via=Via.NONE, name="cli")
SEVERITIES = ["info", "warning", "error"]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    alerts = commands.add_parser("alerts", help="alert rules, destinations, history")
    sub = alerts.add_subparsers(dest="alerts_command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help_text)
        parser.add_argument("--db", help=DB_HELP)
        return parser

    command("rules", "list the rules").add_argument(
        "--project", help="only this project's rules (default: every project)")
    add = command("add-rule", "add a rule")
    add.add_argument("--project", required=True, help="the project whose runs the rule watches")
    add.add_argument("--name", required=True, help="a label for the rule, in its alerts too")
    what = add.add_mutually_exclusive_group(required=True)
    what.add_argument("--finding", metavar="KIND", help="a finding of this kind, or 'any'")
    what.add_argument("--series", choices=["skip_rate", "nonfinite_loss", "scale",
                                           "layer_lost"],
                      help="a series crossing --threshold over the last --window steps")
    what.add_argument("--state", choices=["crashed", "stalled", "finished"],
                      help="the run reaching this state")
    add.add_argument("--threshold", type=float, default=0.0,
                     help="the series value that fires the rule (default 0: any)")
    add.add_argument("--window", type=int, default=100, help="steps (series rules)")
    add.add_argument("--stall-factor", type=float, default=10.0,
                     help="stalled: no step for this many times the usual step interval "
                          "(default 10)")
    add.add_argument("--stall-min-s", type=float, default=120.0,
                     help="stalled: and for at least this many seconds (default 120)")
    add.add_argument("--severity", choices=SEVERITIES, default="error",
                     help="the alerts' severity (default error)")
    add.add_argument("--cooldown-s", type=float, default=600.0,
                     help="seconds before the same rule alerts again for a run (default 600)")
    for name, text in (("enable", "turn a rule on"), ("disable", "turn a rule off"),
                       ("delete-rule", "delete a rule (its alerts stay in the history)")):
        command(name, text).add_argument("id", help="the rule's id, as `alerts rules` shows it")
    command("destinations", "list the destinations (never their URL)").add_argument(
        "--project", help="only this project's destinations (default: every project)")
    dest = command("add-destination", "add a Slack, Discord or webhook destination")
    dest.add_argument("--project", required=True, help="the project whose alerts it receives")
    dest.add_argument("--name", required=True, help="a label for the destination")
    dest.add_argument("--kind", required=True, choices=["slack", "discord", "webhook"],
                      help="the body sent: Slack blocks, a Discord embed, or signed JSON")
    dest.add_argument("--url-file", required=True, metavar="FILE",
                      help="a file holding the webhook URL, or - for stdin")
    dest.add_argument("--min-severity", choices=SEVERITIES, default="warning",
                      help="the least severe alert it receives (default warning)")
    destination_id = "the destination's id, as `alerts destinations` shows it"
    command("delete-destination", "delete a destination").add_argument("id", help=destination_id)
    command("test", "queue a test alert to a destination").add_argument("id", help=destination_id)
    history = command("history", "the alerts sent, newest first")
    history.add_argument("--project", help="only this project's alerts")
    history.add_argument("--run", help="run id, its first 8 or more characters, or its name")
    history.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    handlers: dict[str, Callable[[argparse.Namespace, Session], int]] = {
        "rules": _rules, "add-rule": _add_rule, "enable": _toggle, "disable": _toggle,
        "delete-rule": _delete_rule, "destinations": _destinations,
        "add-destination": _add_destination, "delete-destination": _delete_destination,
        "test": _test, "history": _history,
    }
    from ampscope_server.errors import AmpscopeError

    try:
        with session_for(settings) as session:
            return handlers[args.alerts_command](args, session)
    except AmpscopeError as exc:
        message = exc.message
    except ValidationError as exc:
        message = "; ".join(f"{'.'.join(map(str, e['loc'][1:])) or e['loc'][0]}: {e['msg']}"
                            for e in exc.errors())
    except OSError as exc:
        message = f"cannot read the URL file: {exc.strerror or exc}"
    sys.stderr.write(f"ampscope alerts {args.alerts_command}: {message}\n")
    return EXIT_USAGE


def _condition(rule: RuleRead) -> str:
    condition = rule.condition
    if isinstance(condition, FindingCondition):
        return f"finding {condition.finding_kind or 'any'}"
    if isinstance(condition, SeriesCondition):
        return f"{condition.metric} > {condition.threshold:g} over {condition.window} steps"
    if condition.state == "stalled":
        return f"stalled ({condition.stall_factor:g}x interval, >= {condition.stall_min_s:g} s)"
    return condition.state


def _rules(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.alerts import settings as alert_settings

    rows = [("ID", "PROJECT", "NAME", "CONDITION", "SEVERITY", "COOLDOWN", "ON")]
    rows += [(r.id, r.project, r.name, _condition(r), r.severity, f"{r.cooldown_s:g}s",
              "yes" if r.enabled else "no")
             for r in alert_settings.list_rules(session, OPERATOR, args.project)]
    table(rows)
    return 0


def _add_rule(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.alerts import settings as alert_settings
    from ampscope_server.alerts.schemas import RuleCreate

    condition: dict[str, Any]
    if args.finding is not None:
        condition = {"kind": "finding",
                     "finding_kind": None if args.finding == "any" else args.finding}
    elif args.series is not None:
        condition = {"kind": "series", "metric": args.series, "threshold": args.threshold,
                     "window": args.window}
    else:
        condition = {"kind": "state", "state": args.state, "stall_factor": args.stall_factor,
                     "stall_min_s": args.stall_min_s}
    rule = alert_settings.create_rule(session, OPERATOR, RuleCreate.model_validate({
        "project": args.project, "name": args.name, "condition": condition,
        "severity": args.severity, "cooldown_s": args.cooldown_s}))
    sys.stderr.write(f"ampscope: rule {rule.id} ({_condition(rule)}) added to project "
                     f"{rule.project}\n")
    sys.stdout.write(rule.id + "\n")
    return 0


def _toggle(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.alerts import settings as alert_settings
    from ampscope_server.alerts.schemas import RuleUpdate

    on = args.alerts_command == "enable"
    rule = alert_settings.update_rule(session, OPERATOR, args.id,
                                     RuleUpdate.model_validate({"enabled": on}))
    sys.stderr.write(f"ampscope: rule {rule.id} ({rule.name}) {'on' if on else 'off'}\n")
    return 0


def _delete_rule(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.alerts import settings as alert_settings

    rule = alert_settings.delete_rule(session, OPERATOR, args.id)
    sys.stderr.write(f"ampscope: rule {rule.id} ({rule.name}) deleted\n")
    return 0


def _destinations(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.alerts import settings as alert_settings

    rows = [("ID", "PROJECT", "NAME", "KIND", "TARGET", "FLOOR", "ON")]
    rows += [(d.id, d.project, d.name, d.kind, d.target, d.min_severity,
              "yes" if d.enabled else "no")
             for d in alert_settings.list_destinations(session, OPERATOR, args.project)]
    table(rows)
    return 0


def _add_destination(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.alerts import settings as alert_settings
    from ampscope_server.alerts.schemas import DestinationCreate

    if args.url_file == "-":
        url = sys.stdin.readline().strip()
    else:
        with open(args.url_file, encoding="utf-8") as handle:
            url = handle.read().strip()
    made = alert_settings.create_destination(session, OPERATOR, DestinationCreate.model_validate(
        {"project": args.project, "name": args.name, "kind": args.kind, "url": url,
         "min_severity": args.min_severity}))
    sys.stderr.write(f"ampscope: destination {made.id} ({made.kind} {made.target}) added to "
                     f"project {made.project}"
                     + ("; its signing secret is shown once, below\n" if made.signing_secret
                        else "\n"))
    sys.stdout.write((made.signing_secret or made.id) + "\n")
    return 0


def _delete_destination(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.alerts import settings as alert_settings

    dest = alert_settings.delete_destination(session, OPERATOR, args.id)
    sys.stderr.write(f"ampscope: destination {dest.id} ({dest.name}) deleted\n")
    return 0


def _test(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.alerts import settings as alert_settings

    alert = alert_settings.send_test(session, OPERATOR, args.id)
    sys.stderr.write(f"ampscope: test alert {alert.id} queued; the running server sends it "
                     "within a second (see `ampscope alerts history`)\n")
    return 0


def _history(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.alerts import settings as alert_settings
    from ampscope_server.alerts.settings import HistoryQuery
    from ampscope_server.runs import reads as runs

    run_id = None if args.run is None else runs.resolve_run(session, args.run).id
    page = alert_settings.alert_history(session, OPERATOR, HistoryQuery(
        project=args.project, run_id=run_id, limit=args.limit))
    rows = [("ID", "WHEN", "EVENT", "LEVEL", "RUN", "STEPS", "TITLE", "DELIVERED")]
    for a in page.alerts:
        steps = "-" if a.step_start is None else f"{a.step_start}-{a.step_end}"
        sent = ", ".join(f"{d.destination}: {d.status}" for d in a.deliveries) or "-"
        rows.append((str(a.id), when(a.created_at), a.event, a.severity,
                     (a.run_id or "-")[:8], steps, a.title, sent))
    table(rows)
    return 0

"""``kubectl ddp``, installed as ``kubectl-ddp`` (so kubectl finds it as a plugin): submit a
script as a DDPJob, watch it, read its nodes' merged logs, plot its loss. Thin: it parses,
calls :mod:`ddp_client.client` and prints.

Exit codes: 0 done (``watch``: the job Succeeded), 1 the job Failed, 2 an error the user can
fix (no such job, no cluster, no such script, a bad flag), 3 ``watch --timeout`` ran out,
130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ddp_api.ddpjob import FaultToleranceMode

from .client import DDPClient
from .errors import DDPError, WaitTimeout
from .jobs import read_script
from .live import LiveView, exit_code, outcome_line
from .objects import AUTO_LAUNCHER, LAUNCHERS, ScriptOptions

PROG = "kubectl ddp"
EXIT_ERROR, EXIT_TIMEOUT, EXIT_INTERRUPTED = 2, 3, 130


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, not {value!r}")
    return n


def _nproc(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return _positive(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be an integer >= 1 or auto, not {value!r}"
        ) from None


def _connection(p: argparse.ArgumentParser, default: object) -> None:
    """The flags that say which cluster and namespace, as kubectl has them. Both the top parser
    and each command's take them (``kubectl ddp -n team watch job`` and ``kubectl ddp watch job
    -n team``); a command's default is SUPPRESS, so that it does not overwrite a value given
    before the command."""
    p.add_argument(
        "-n", "--namespace", default=default, help="default: the kubeconfig context's namespace"
    )
    p.add_argument(
        "--kubeconfig", default=default, help="default: $KUBECONFIG, then ~/.kube/config"
    )
    p.add_argument(
        "--context", default=default, help="kubeconfig context; default: the current one"
    )


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _connection(common, argparse.SUPPRESS)

    top = argparse.ArgumentParser(
        prog=PROG,
        description="Run and follow DDPJobs: PyTorch DDP training under torchrun on Kubernetes.",
        epilog="Exit codes: 0 done (watch: Succeeded), 1 the job Failed, 2 an error (no such"
        " job, script or cluster), 3 watch --timeout ran out.",
    )
    _connection(top, None)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    submit = commands.add_parser(
        "submit",
        parents=[common],
        help="run a script under torchrun as a DDPJob; prints the job's name",
        description="The script becomes a ConfigMap (owned by the job) mounted at /scripts, and"
        " a DDPJob runs it under torchrun on every node (`torchrun /scripts/SCRIPT ARGS`, started"
        " by the trainer image's node wrapper unless --image is given or --launcher says"
        " otherwise). Arguments after `--` go to the script.",
        usage=f"{PROG} submit SCRIPT.py [options] [-- ARGS...]",
    )
    submit.add_argument("script", metavar="SCRIPT.py", help="a single-file training script")
    submit.add_argument("--name", help="the DDPJob's name; default: the script's and a suffix")
    submit.add_argument("--nodes", type=_positive, help="pods; default 1 (--max when elastic)")
    submit.add_argument(
        "--nproc", type=_nproc, default=1, metavar="N", help="workers per pod, or auto (1)"
    )
    submit.add_argument("--min", type=_positive, dest="min_nodes", help="elastic: fewest pods")
    submit.add_argument("--max", type=_positive, dest="max_nodes", help="elastic: most pods")
    submit.add_argument("--image", help="default: the operator's trainer image (it has torch)")
    submit.add_argument(
        "--launcher",
        choices=[*LAUNCHERS, AUTO_LAUNCHER],
        default=AUTO_LAUNCHER,
        help="node: torchrun under the trainer image's node wrapper (it rides out a replaced"
        " rendezvous store, keeps the log on the checkpoint volume and says why a worker"
        " failed); torchrun: plain torchrun, for an image without the wrapper; auto (the"
        " default): node unless --image is given",
    )
    submit.add_argument(
        "--fault-tolerance",
        choices=[m.value for m in FaultToleranceMode],
        help="Restart (the default): a lost pod restarts every worker from the checkpoint;"
        " PerStep: each pod is a torchft replica group and the others train on (the script"
        " uses torchft's Manager: docs/api.md)",
    )
    submit.add_argument(
        "--min-groups", type=_positive, metavar="N", help="PerStep: fewest groups that train"
    )
    submit.add_argument(
        "--group-timeout",
        type=_positive,
        dest="group_timeout_s",
        metavar="S",
        help="PerStep: seconds of silence before a group is dropped (5)",
    )
    submit.add_argument(
        "--checkpoint-claim",
        metavar="PVC",
        help="a PersistentVolumeClaim for the checkpoint volume ($DDPJOB_CHECKPOINT_DIR)",
    )

    watch = commands.add_parser(
        "watch",
        parents=[common],
        help="show a job's progress until it ends; the exit code says how",
    )
    watch.add_argument("job", metavar="JOB")
    watch.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds")

    logs = commands.add_parser(
        "logs",
        parents=[common],
        help="every node's log merged in time order, each line with its node and rank",
        description="From the pods' logs while the job has pods; once it has none (after a"
        " TTL, a deletion, a lost machine), or with --from-volume, from the logs its nodes kept"
        " on the checkpoint volume, which a short-lived pod reads.",
    )
    logs.add_argument("job", metavar="JOB")
    logs.add_argument("-f", "--follow", action="store_true", help="until the job ends")
    logs.add_argument("--rank", type=int, metavar="R", help="only global rank R's lines")
    logs.add_argument("--timestamps", action="store_true", help="the time of each line first")
    logs.add_argument(
        "--from-volume",
        action="store_true",
        help="the logs kept on the checkpoint volume: every attempt of every node",
    )
    logs.add_argument("--image", help="image of the volume's reader pod; default: the job's")
    logs.add_argument(
        "--timeout", type=float, default=180.0, metavar="S", help="for the reader pod (180)"
    )

    plot = commands.add_parser(
        "plot",
        parents=[common],
        help="loss and learning rate by step, from the job's metrics.jsonl",
        description="A short-lived pod prints metrics.jsonl from the job's checkpoint volume;"
        " its loss and learning rate are drawn to the output file.",
    )
    plot.add_argument("job", metavar="JOB")
    plot.add_argument("-o", "--output", required=True, metavar="FILE", help="e.g. loss.png")
    plot.add_argument("--image", help="image of the reader pod; default: the job's")
    plot.add_argument(
        "--timeout", type=float, default=180.0, metavar="S", help="for the reader pod (180)"
    )
    return top


def _client(args: argparse.Namespace) -> DDPClient:
    return DDPClient(args.namespace, kubeconfig=args.kubeconfig, context=args.context)


def _submit(args: argparse.Namespace, script_args: list[str]) -> int:
    read_script(args.script)  # a missing script is said before the cluster is asked anything
    ddp = _client(args)
    options = ScriptOptions(
        name=args.name,
        nodes=args.nodes,
        nproc_per_node=args.nproc,
        min_nodes=args.min_nodes,
        max_nodes=args.max_nodes,
        image=args.image,
        checkpoint_claim=args.checkpoint_claim,
        args=tuple(script_args),
        launcher=args.launcher,
        fault_tolerance=args.fault_tolerance,
        min_groups=args.min_groups,
        group_timeout_s=args.group_timeout_s,
    )
    name = ddp.submit_script(args.script, options)
    print(name, flush=True)
    print(
        f"ddpjob {name} created in namespace {ddp.namespace}: {PROG} watch {name}", file=sys.stderr
    )
    return 0


def _watch(args: argparse.Namespace) -> int:
    view = LiveView(lambda s: print(s, end="", flush=True), tty=sys.stdout.isatty(), indent="")
    ddp = _client(args)
    try:
        status = ddp.wait(
            args.job,
            args.timeout,
            on_status=lambda s: view(s.model_dump(by_alias=True, exclude_none=True, mode="json")),
        )
    except WaitTimeout as error:
        view.close()
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_TIMEOUT
    view.close()
    print(outcome_line(args.job, status.model_dump(by_alias=True, exclude_none=True, mode="json")))
    code = exit_code(status.phase)
    return EXIT_ERROR if code is None else code


def _logs(args: argparse.Namespace) -> int:
    lines = _client(args).logs(
        args.job,
        follow=args.follow,
        rank=args.rank,
        from_volume=args.from_volume,
        image=args.image,
        timeout_s=args.timeout,
        on_note=lambda note: print(f"{PROG}: {note}", file=sys.stderr, flush=True),
    )
    for line in lines:
        print(line.show(args.timestamps), flush=args.follow)
    return 0


def _plot(args: argparse.Namespace) -> int:
    drawn = _client(args).plot(args.job, args.output, image=args.image, timeout_s=args.timeout)
    c = drawn.curves
    names = [
        name for name, points in (("training loss", c.loss), ("learning rate", c.lr)) if points
    ]
    steps = c.loss or c.lr
    print(f"{drawn.path}: {' and '.join(names)} of steps {steps[0][0]} to {steps[-1][0]}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:  # what follows goes to the submitted script
        script_args = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    args = parser().parse_args(argv)
    if script_args and args.command != "submit":
        parser().error("arguments after -- are for `submit` only")
    try:
        if args.command == "submit":
            return _submit(args, script_args)
        if args.command == "watch":
            return _watch(args)
        if args.command == "logs":
            return _logs(args)
        return _plot(args)
    except DDPError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `kubectl ddp logs JOB | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

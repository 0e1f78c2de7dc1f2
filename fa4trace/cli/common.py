"""What every `fa4trace` command shares: the one-line error handling of the command group
(``OneLineErrors``, ``fail``, ``first_line``, the exit statuses), the output-file check
(``check_out``) and the options several commands take (``--roles``, ``--families``, the
packages a kernel needs).

Every failure prints one line (``fa4trace: error: ...``) and exits non-zero: bad input, a
missing file, a missing optional package (what is missing and the pip command that brings it)
alike; nothing a user recorded is overwritten without --force.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..format.errors import Fa4traceError, WouldOverwrite
from ..run import deps

EXIT_USAGE = 2
EXIT_FAIL = 1
DEBUG_ENV = "FA4TRACE_DEBUG"  # set to 1: an unexpected error shows its traceback instead of one line


# Commands users look for under another name: click's spelling suggestion misses them
# (`fa4trace export` would be offered `plot`).
COMMAND_HINTS = {"export": "convert", "perfetto": "convert", "chrome": "convert", "info": "summary",
                 "show": "view", "open": "view", "serve": "view"}


class OneLineErrors(click.Group):
    """Turn usage errors, fa4trace errors and missing packages into one line on stderr."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name in COMMAND_HINTS and self.get_command(ctx, name) is None:
            raise click.UsageError(f"No such command {name!r}. Did you mean {COMMAND_HINTS[name]!r}?", ctx)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except WouldOverwrite as e:  # say how to allow it where the command can
            cmd = self.get_command(ctx, ctx.invoked_subcommand) if ctx.invoked_subcommand else None
            if cmd is not None and any(p.name == "force" for p in cmd.params):
                raise WouldOverwrite(f"{e} (add --force)") from None
            raise

    def main(self, args=None, prog_name=None, **kw):
        try:
            rv = super().main(args=args, prog_name=prog_name or "fa4trace", standalone_mode=False, **kw)
            return rv if isinstance(rv, int) else 0
        except click.exceptions.Exit as e:
            return e.exit_code
        except click.Abort:
            fail("aborted", EXIT_FAIL)
        except click.UsageError as e:
            hint = f" (see: {e.ctx.command_path} --help)" if e.ctx else ""
            fail(f"{one_line(e.format_message())}{hint}", EXIT_USAGE)
        except click.ClickException as e:
            fail(one_line(e.format_message()), e.exit_code or EXIT_FAIL)
        except (Fa4traceError, ValueError, OSError, KeyError) as e:
            fail(first_line(e), EXIT_FAIL)
        except ImportError as e:  # an optional package imported past the checks (or broken)
            fail(deps.explain(e) or f"a module does not import here: {first_line(e)}", EXIT_FAIL)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except Exception as e:  # noqa: BLE001 - a bug: still one line, unless asked for the traceback
            if os.environ.get(DEBUG_ENV):
                raise
            fail(f"unexpected {type(e).__name__}: {first_line(e)} (a bug in fa4trace: please report it; "
                 f"{DEBUG_ENV}=1 shows where it happened)", EXIT_FAIL)


def one_line(text: str) -> str:
    """``text`` on one line: click lists a missing option's choices one per line
    ("Choose from:\n\tperfetto,\n\tchrome"); an error is one line."""
    return " ".join(text.split())


def first_line(e: BaseException) -> str:
    """The first line of an error's text; a file error as "FILE: what" (no errno, no repr)."""
    if isinstance(e, OSError) and not isinstance(e, Fa4traceError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"  # not "[Errno 2] No such file or directory: 'x'"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def fail(msg: str, code: int):
    """Say ``msg`` as fa4trace's one error line on stderr and exit with ``code``."""
    click.echo(f"fa4trace: error: {msg}", err=True)
    sys.exit(code)


def check_out(path: str, force: bool) -> Path:
    """The output file ``path``, refused when it is empty, exists (unless ``force``) or is a folder."""
    if not str(path).strip():
        raise Fa4traceError("the output path is empty: give a file name")
    p = Path(path)
    if p.is_dir():
        raise Fa4traceError(f"{p} is a directory")
    if p.exists() and not force:
        raise WouldOverwrite(f"{p} exists; refusing to overwrite it")
    return p


# ---- options several commands take ---------------------------------------------------------
ROLES_HELP = ("Any-kernel bundles: the role of some warps, ROLE=WARPS (e.g. producer=4 or mma=0-3,8); repeat for "
              "more roles. Wins over the roles the bundle names or the analysis infers.")


def parse_roles(values) -> dict:
    """('producer=4', 'mma=0-3,8') -> {'producer': [4], 'mma': [0, 1, 2, 3, 8]}."""
    out: dict = {}
    for v in values:
        role, sep, warps = v.partition("=")
        role = role.strip()
        if not sep or not role or not warps.strip():
            raise click.BadParameter(f"--roles takes ROLE=WARPS (e.g. producer=4 or mma=0-3), got {v!r}")
        for part in warps.split(","):
            try:
                a, _, b = part.strip().partition("-")
                lo, hi = int(a), int(b or a)
            except ValueError:
                raise click.BadParameter(f"--roles {v!r}: warps must be indices or ranges like 0-3") from None
            if hi < lo:
                raise click.BadParameter(f"--roles {v!r}: the range {part.strip()} runs backwards (write {hi}-{lo})")
            out.setdefault(role, []).extend(range(lo, hi + 1))
    return out


def parse_families(families: str | None) -> tuple:
    """``--families a,b``: the generic event families named (empty for None)."""
    from ..auto.events import FAMILIES

    fams = tuple(f.strip() for f in (families or "").split(",") if f.strip())
    bad = set(fams) - set(FAMILIES)
    if bad:
        raise click.BadParameter(f"--families: unknown {', '.join(sorted(bad))}; families are {', '.join(FAMILIES)}")
    return fams


def require_kernels(purpose: str) -> None:
    """torch, and the CuTe DSL to compile fa4trace's kernels here or tvm-ffi to load a build."""
    deps.require(purpose, "torch")
    deps.require_route(purpose, jit=("cutlass",), aot=("tvm_ffi",))

"""The exceptions initadvisor raises on bad input. The CLI prints any of them as one line and exits 2."""

from __future__ import annotations


def one_line(text: str) -> str:
    """Line breaks folded to spaces, other unprintable characters escaped: messages stay one terminal line."""
    text = " ".join(text.splitlines())
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class InitAdvisorError(Exception):
    """Base of every error initadvisor raises on bad input (never on a defect)."""


class SpecError(InitAdvisorError, ValueError):
    """An invalid spec or HuggingFace config: one line naming file, line and key."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None, key: str | None = None):
        self.file, self.line, self.key, self.message = file, line, key, message
        where = f"{file}:{line}" if file and line else (file or "<spec>")
        super().__init__(one_line(f"{where}: {key + ': ' if key else ''}{message}"))


InvalidSpecError = SpecError


class UsageError(SpecError):
    """A bad argument or option value (`option` is its command-line name, e.g. --seq-len)."""

    def __init__(self, message: str, option: str | None = None):
        self.file, self.line, self.key, self.message = "command line", None, option, message
        ValueError.__init__(self, one_line(f"{option}: {message}" if option else message))


class MissingExtraError(InitAdvisorError, ImportError):
    """An optional dependency is not installed; the message names the pip extra that provides it."""

    def __init__(self, what: str, extra: str, package: str):
        self.extra = extra
        super().__init__(f"{what} needs {package}: pip install 'initadvisor[{extra}]'")

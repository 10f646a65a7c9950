"""Task repositories: find or clone a mirror, make a clean working copy at the task's base commit, and
collect the agent's patch from it afterwards.

The agent never works inside a mirror, and nothing here writes into one: each attempt gets its own
repository that borrows the mirror's objects (`objects/info/alternates`) to check out the base
commit and then copies them (repack), so a user's mirror (their own working clone, dirty or not, or
a read-only folder) is only read. Borrowing also takes mirrors that `git clone` refuses: a bare
folder whose empty `refs/` was lost in copying (as in ../shared/data/repos) is still a pack and a HEAD.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from lumobench.errors import LumobenchError

# Settings that a user's git config could change and that would corrupt a SWE-bench patch or a checkout;
# no optional locks, so `status` in a mirror never refreshes (writes) its index.
_GIT_SAFE = (
    "--no-optional-locks",
    "-c",
    "core.quotepath=off",
    "-c",
    "core.autocrlf=false",
    "-c",
    "diff.noprefix=false",
    "-c",
    "diff.mnemonicPrefix=false",
    "-c",
    "color.ui=false",
    "-c",
    "advice.detachedHead=false",
)


def git(args: list[str], cwd: Path | None = None, timeout_s: float = 600, stdin: str = "") -> str:
    """Run one git command and return its stdout; failures raise `LumobenchError` with git's message."""
    try:
        out = subprocess.run(
            ["git", *_GIT_SAFE, *args],
            cwd=cwd,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except FileNotFoundError:
        raise LumobenchError("git is not installed (needed to prepare task repositories)") from None
    except subprocess.TimeoutExpired:
        raise LumobenchError(f"git {args[0]} timed out after {timeout_s:.0f} s") from None
    if out.returncode != 0:
        lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
        raise LumobenchError(f"git {args[0]} failed: {lines[-1] if lines else f'exit {out.returncode}'}")
    return out.stdout


def _mirror_candidates(repo: str, repos_dir: Path) -> list[Path]:
    owner, _, name = repo.partition("/")
    stems = [f"{owner}__{name}", f"{owner}/{name}", name]
    return [repos_dir / (stem + suffix) for stem in stems for suffix in ("", ".git")]


def find_mirror(repo: str, repos_dir: Path) -> Path | None:
    """A git repository for `repo` ("owner/name") under `repos_dir`: `owner__name`, `owner/name` or `name`,
    each bare (`.git` suffix) or not; None if there is none."""
    for path in _mirror_candidates(repo, repos_dir):
        if (path / ".git").exists() or (path / "HEAD").is_file():
            return path
    return None


def ensure_mirror(repo: str, repos_dir: Path, allow_clone: bool = True) -> Path:
    """The local mirror of `repo`; without one, clone `https://github.com/<repo>` into `repos_dir` once."""
    mirror = find_mirror(repo, repos_dir)
    name = repo.split("/")[-1]
    if mirror is not None:
        return mirror
    looked = f"no mirror of {repo} under {repos_dir} (looked for {repo.replace('/', '__')}, {repo}, {name})"
    if not allow_clone:
        raise LumobenchError(looked)
    url = f"https://github.com/{repo}.git"
    dest = repos_dir / f"{repo.replace('/', '__')}.git"
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    repos_dir.mkdir(parents=True, exist_ok=True)
    try:
        git(["clone", "--mirror", "--quiet", url, str(partial)], timeout_s=3600)
    except LumobenchError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise LumobenchError(f"{looked}, and cloning {url} failed ({exc}); put a clone there") from None
    partial.rename(dest)
    return dest


def uncommitted_changes(mirror: Path) -> list[str]:
    """Paths with uncommitted changes in a non-bare mirror (the task clone ignores them; callers say so)."""
    if not (mirror / ".git").exists():
        return []
    status = git(["status", "--porcelain", "--untracked-files=no"], cwd=mirror)
    return [line[3:] for line in status.splitlines() if line.strip()]


def _git_dir(mirror: Path) -> Path:
    """The git directory holding a mirror's objects: `.git` of a working clone (or the common directory
    a `.git` file points to), else the bare mirror itself."""
    dot_git = mirror / ".git"
    if dot_git.is_file():  # a linked worktree or a submodule
        return Path(git(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=mirror).strip())
    return dot_git if dot_git.is_dir() else mirror


def mirror_objects(mirror: Path) -> Path:
    """The absolute path of `mirror`'s object store."""
    return _git_dir(mirror).resolve() / "objects"


def borrow(mirror: Path, repo: Path, bare: bool = False) -> None:
    """Make `repo` a new repository that reads `mirror`'s objects (and its shallow list) in place.
    It must never write an object `mirror` holds: git would freshen (touch) the mirror's pack."""
    objects = mirror_objects(mirror)
    git(["init", "--quiet", *(["--bare"] if bare else []), str(repo)])
    own = repo if bare else repo / ".git"
    (own / "objects" / "info" / "alternates").write_text(f"{objects}\n")
    if (objects.parent / "shallow").is_file():  # without it, history stops at a missing parent
        shutil.copyfile(objects.parent / "shallow", own / "shallow")


def missing_commits(mirror: Path, commits: list[str]) -> list[str]:
    """Those of `commits` (full ids) that `mirror` does not hold; reads the mirror, writes nothing into it."""
    with tempfile.TemporaryDirectory(prefix="lumobench-mirror-") as tmp:
        probe = Path(tmp) / "probe.git"
        borrow(mirror, probe, bare=True)
        queries = "".join(f"{commit}^{{commit}}\n" for commit in commits)
        answers = git(["cat-file", "--batch-check=%(objecttype)"], cwd=probe, stdin=queries).splitlines()
    return [commit for commit, answer in zip(commits, answers, strict=True) if answer != "commit"]


def prepare_workspace(mirror: Path, base_commit: str, dest: Path) -> Path:
    """A new repository at `dest` detached at `base_commit` of `mirror`, holding its own copy of that
    commit's objects, with no remote, branches or tags (so later history — the fix — is not reachable
    by `git log --all`). A leftover `dest` from an interrupted attempt is replaced: it is scratch
    space, and results hold the recorded patches."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    borrow(mirror, dest)
    try:
        git(["checkout", "--quiet", "--detach", base_commit], cwd=dest)
    except LumobenchError as exc:
        raise LumobenchError(f"base commit {base_commit} is not usable in mirror {mirror} ({exc})") from None
    # Copy what HEAD needs and stop borrowing: git "freshens" (sets the mtime of) a borrowed pack
    # whenever it writes an object the pack already holds, as the agent's `git add` would.
    git(["repack", "-a", "-d", "--quiet"], cwd=dest)
    (dest / ".git" / "objects" / "info" / "alternates").unlink()
    git(["config", "user.name", "lumobench agent"], cwd=dest)
    git(["config", "user.email", "agent@lumobench.invalid"], cwd=dest)
    head, base = (git(["rev-parse", ref], cwd=dest) for ref in ("HEAD", f"{base_commit}^{{commit}}"))
    dirty = git(["status", "--porcelain"], cwd=dest).strip()
    if head != base or dirty:
        raise LumobenchError(f"working copy {dest} not clean at {base_commit} after checkout: {dirty[:99]}")
    return dest


def collect_patch(workdir: Path, base_commit: str) -> str:
    """The agent's change as a unified diff against the base commit: edits, new files (not ignored ones)
    and anything the agent committed. Stages the working tree to include new files."""
    git(["add", "-A"], cwd=workdir)
    return git(["diff", "--cached", "--no-ext-diff", base_commit], cwd=workdir)

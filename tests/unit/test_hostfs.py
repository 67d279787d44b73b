import os

import pytest

from boxwright.errors import SandboxPathError
from boxwright.providers._hostfs import PathMap


@pytest.fixture
def root(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    return tmp_path


def test_workspace_paths_map_under_the_root(root):
    paths = PathMap([("/workspace", str(root / "ws"))], fallback=str(root / "ws"))
    ws = str(root / "ws")
    assert paths.host("/workspace") == ws
    assert paths.host("/workspace/a/b.txt") == f"{ws}/a/b.txt"
    assert paths.host("a/b.txt") == f"{ws}/a/b.txt"
    # local-process: any other absolute path lands under the root, not on the host
    assert paths.host("/tmp/x") == f"{ws}/tmp/x"
    assert paths.host("/workspace/a/../b") == f"{ws}/b"


@pytest.mark.parametrize(
    "path", ["/workspace/../../../etc/hosts", "../outside", "/workspace/a/../../x", "/../../etc/passwd", "a\x00b"]
)
def test_escapes_are_refused_before_dotdot_is_folded(root, path):
    paths = PathMap([("/workspace", str(root / "ws"))], fallback=str(root / "ws"))
    with pytest.raises(SandboxPathError) as err:
        paths.host(path)
    assert err.value.path == path


def test_symlink_out_of_the_root_is_refused_but_the_link_itself_is_reachable(root):
    ws = root / "ws"
    os.symlink("/etc", ws / "etc-link")
    paths = PathMap([("/workspace", str(ws))], fallback=None)
    with pytest.raises(SandboxPathError, match="symlink"):
        paths.host("/workspace/etc-link/hosts")
    with pytest.raises(SandboxPathError, match="symlink"):
        paths.host("/workspace/etc-link")
    # lstat/remove act on the link, not its target
    assert paths.host("/workspace/etc-link", follow=False) == f"{ws}/etc-link"
    with pytest.raises(SandboxPathError):
        paths.host("/workspace/etc-link/hosts", follow=False)


def test_mounts_without_fallback_refuse_other_absolute_paths(root):
    paths = PathMap([("/workspace", str(root / "ws")), ("/tmp", str(root / "tmp"))], fallback=None)
    assert paths.host("/tmp/j.ndjson") == f"{root}/tmp/j.ndjson"
    with pytest.raises(SandboxPathError, match="outside every directory"):
        paths.host("/etc/passwd")
    # a prefix that only looks like a mount is not one
    with pytest.raises(SandboxPathError):
        paths.host("/workspacefoo/x")

"""commbench/cluster_state.py: a cluster's names and its state file, read back checked (no root needed)."""
import json
import os

from commbench import cluster_state as S


def test_a_cluster_names_its_namespaces_and_addresses():
    c = S.Cluster("ab12", 2, 4, 10**9)
    assert c.namespaces == ["cbemu-ab12-n0", "cbemu-ab12-n1", "cbemu-ab12-sw"] and c.shape == "2x4"
    assert c.address(0) == "198.18.0.1" and S.tag_of("cbemu-ab12-n1") == "ab12" == S.tag_of(c.switch)
    assert S.tag_of("cbemu-AB-n1") is None and S.tag_of("other-ab12-sw") is None


def test_the_owner_decides_whether_a_cluster_lives():
    me = os.getpid()
    assert S.Cluster("a", 1, 1, 1).alive()  # kept by `emulate up`: no owner
    assert S.Cluster("a", 1, 1, 1, owner_pid=me, owner_start=S.start_time(me)).alive()
    assert not S.Cluster("a", 1, 1, 1, owner_pid=me, owner_start=-1).alive()  # the pid was reused
    assert not S.Cluster("a", 1, 1, 1, owner_pid=-1).alive()


def test_state_files_read_back_their_own_cluster_only(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "STATE_DIR", str(tmp_path))
    kept = S.Cluster("c0ffee", 2, 1, 10**8, created=12.5)
    S.write_state(kept)
    assert S.state_files() == [(S.state_path("c0ffee"), kept)]
    (tmp_path / "dead.json").write_text(json.dumps({**json.loads((tmp_path / "c0ffee.json").read_text())}))
    (tmp_path / "ffff.json").write_text('{"tag": "ffff", "nodes": 100000}')  # past MAX_NODES
    (tmp_path / "eeee.json").write_text('{"tag": "eeee", "nodes": true}')  # a boolean is no count
    (tmp_path / "dddd.json").write_text("[")
    found = dict(S.state_files())
    assert found.pop(str(tmp_path / "c0ffee.json")) == kept and set(found.values()) == {None}  # copies, damage
    assert len(found) == 4
    S.remove_file(str(tmp_path / "dead.json"))
    assert not (tmp_path / "dead.json").exists()

# test_session_ids.py - session ids do not repeat across daemon restarts. They were a counter
# and rand() never seeded: every daemon's first session was ses-1-4567, so after a restart
# `conch attach` joined the dead session of the previous daemon and the first `conch shell`
# replayed its scrollback.


def first_session(d):
    c = d.client()
    sb = c.call("sandbox.create", {}, timeout=30)["id"]
    sid = c.call("session.open", {"sandbox": sb}, timeout=30)["session"]
    c.call("sandbox.destroy", {"id": sb}, timeout=30)
    return sid


def test_a_restarted_daemon_names_its_sessions_anew(daemon_factory):
    d = daemon_factory(extra_args=["--pool", "0"])
    ids = [first_session(d)]
    for _ in range(2):
        exited, rc = d.stop()
        assert exited, "conch serve did not stop"
        d.start()
        ids.append(first_session(d))
    assert len(set(ids)) == len(ids), f"a restarted daemon reused a session id: {ids}"

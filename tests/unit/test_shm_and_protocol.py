"""Shared memory and the engine <-> worker wire format, in this process only.

``_workers.shm``: ``Layout.plan`` (time-major storage fields ``[K, T(+1), N, ...]``, their
order, 64-byte alignment, the control block after them), ``create_segment`` +
``SharedArrays`` over a memfd (two mappings of one segment see the same bytes, as engine and
worker do), ``SharedArrays.obs``.
``_workers.protocol``: ``frame``/``parse_frame`` (whole, partial and back-to-back frames),
``recv_frame`` over a socket pair, the control words, and ``spin_budget``
(machine, ``AIOCOLLECT_SPIN``). Every fd opened here is closed.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct

import numpy as np
import pytest

from aiocollect._workers import protocol
from aiocollect._workers.shm import CONTROL_WORDS, Field, Layout, SharedArrays, create_segment

OBS = [(np.dtype(np.float32), (3,)), (np.dtype(np.int64), ())]
ACTION = (np.dtype(np.int64), ())


@pytest.fixture
def segment():
    """A layout for 4 envs in 2 workers, 3 columns, 2 slots; its memfd and one mapping of
    it; the fd is closed after."""
    layout = Layout.plan(OBS, ACTION, num_envs=4, num_lanes=2, columns=3, slots=2)
    fd = create_segment(layout.size)
    try:
        yield layout, fd, SharedArrays(layout, fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- Layout


def test_layout_lays_the_fields_out_time_major_in_order_each_on_its_own_cache_lines():
    layout = Layout.plan(OBS, ACTION, num_envs=4, num_lanes=2, columns=3, slots=2)
    assert [(f.name, f.dtype, f.shape, f.offset) for f in layout.fields] == [
        ("obs0", "<f4", (2, 4, 4, 3), 0),  # 2 * 4 * 4 * 3 * 4 = 384 bytes: 6 lines
        ("next_obs0", "<f4", (2, 3, 4, 3), 384),  # 288 bytes, padded to 5 lines (320)
        ("obs1", "<i8", (2, 4, 4), 704),  # 256 bytes: 4 lines
        ("next_obs1", "<i8", (2, 3, 4), 960),  # 192 bytes: 3 lines
        ("reward", "<f4", (2, 3, 4), 1152),  # 96 bytes, padded to 2 lines
        ("terminated", "|b1", (2, 3, 4), 1280),  # 24 bytes: one line each from here on
        ("truncated", "|b1", (2, 3, 4), 1344),
        ("action", "<i8", (3, 4), 1408),  # every column's actions: 96 bytes, 2 lines
        ("reset_mask", "|b1", (4,), 1536),
        ("seed", "<i8", (4,), 1600),
        ("seed_set", "|b1", (4,), 1664),
    ]
    assert layout.control == Field("control", "<i8", (2, CONTROL_WORDS), 1728)
    assert CONTROL_WORDS == 16  # two 64-byte lines of int64 per worker
    assert layout.size == 1728 + 2 * 128
    assert (layout.num_obs, layout.slots, layout.columns) == (2, 2, 3)


def test_layout_defaults_to_one_column_and_two_slots():
    layout = Layout.plan(OBS, ACTION, num_envs=4, num_lanes=2)
    shapes = {f.name: f.shape for f in layout.fields}
    assert (layout.slots, layout.columns) == (2, 1)
    assert shapes["obs0"] == (2, 2, 4, 3) and shapes["next_obs0"] == (2, 1, 4, 3)
    assert shapes["obs1"] == (2, 2, 4) and shapes["reward"] == (2, 1, 4)
    assert shapes["action"] == (1, 4) and shapes["seed"] == (4,)


def test_a_field_larger_than_a_line_takes_whole_lines():
    layout = Layout.plan([(np.dtype(np.float64), (5, 2))], (np.dtype(np.float32), (3,)), num_envs=7, num_lanes=3,
                         columns=2, slots=3)
    fields = {f.name: f for f in layout.fields}
    assert fields["obs0"].shape == (3, 3, 7, 5, 2)
    assert fields["obs0"].nbytes == 3 * 3 * 7 * 5 * 2 * 8 == 5040
    assert fields["next_obs0"].offset == 5056  # 5040 rounded up to 79 lines
    assert fields["next_obs0"].nbytes == 3 * 2 * 7 * 5 * 2 * 8 == 3360
    assert fields["reward"].offset == 5056 + 3392  # 3360 rounded up to 53 lines
    assert fields["terminated"].offset == 8448 + 192  # 3 * 2 * 7 float32: 168 bytes, 3 lines
    assert fields["action"].offset == 8768 and fields["action"].nbytes == 2 * 7 * 3 * 4 == 168
    assert fields["reset_mask"].offset == 8768 + 192  # 168 bytes: three lines
    assert fields["seed_set"].offset == 9088 and layout.control.offset == 9152
    assert all(f.offset % 64 == 0 for f in layout.fields) and layout.control.offset % 64 == 0
    for a, b in zip(layout.fields[:-1], layout.fields[1:], strict=True):
        assert a.offset + a.nbytes <= b.offset
    assert layout.size == 9152 + 3 * 128


def test_an_empty_field_still_gets_its_own_line():
    layout = Layout.plan([(np.dtype(np.float32), (0,))], ACTION, num_envs=2, num_lanes=1)
    fields = {f.name: f for f in layout.fields}
    assert fields["obs0"].nbytes == 0 and fields["next_obs0"].nbytes == 0
    assert (fields["obs0"].offset, fields["next_obs0"].offset, fields["reward"].offset) == (0, 64, 128)


def test_a_layout_survives_pickling():
    layout = Layout.plan(OBS, ACTION, num_envs=4, num_lanes=2, columns=5)
    assert pickle.loads(pickle.dumps(layout)) == layout


# --------------------------------------------------------------------------- segment and arrays


def test_a_new_segment_has_the_size_asked_for_and_is_not_inherited():
    fd = create_segment(4096 + 3)
    try:
        assert os.fstat(fd).st_size == 4096 + 3
        assert os.get_inheritable(fd) is False
    finally:
        os.close(fd)


def test_shared_arrays_are_zeroed_views_with_the_layouts_shapes_dtypes_and_offsets(segment):
    layout, _, shared = segment
    assert list(shared.arrays) == [f.name for f in layout.fields]
    base = shared.arrays["obs0"].ctypes.data
    for f in layout.fields:
        a = shared.arrays[f.name]
        assert a.shape == f.shape and a.dtype == np.dtype(f.dtype), f.name
        assert not a.any(), f.name
        assert a.ctypes.data - base == f.offset, f.name
        assert a.ctypes.data % 64 == 0, f.name
    assert shared.control.shape == (2, CONTROL_WORDS) and shared.control.dtype == np.int64
    assert shared.control.ctypes.data - base == layout.control.offset
    assert not shared.control.any()


def test_storage_is_time_major_so_a_column_of_a_block_of_rows_is_contiguous(segment):
    _, _, shared = segment
    obs0, reward = shared.arrays["obs0"], shared.arrays["reward"]
    # [K=2, T+1=4, N=4, 3] float32: element [1, 2, 3, 0] sits ((1 * 4 + 2) * 4 + 3) * 3 floats in
    assert obs0[1, 2, 3].ctypes.data - obs0.ctypes.data == 27 * 3 * 4
    # [K=2, T=3, N=4] float32: element [1, 2, 3] sits (1 * 3 + 2) * 4 + 3 floats in
    assert reward[1, 2, 3:].ctypes.data - reward.ctypes.data == 23 * 4
    for block in (obs0[1, 2, 1:3], reward[0, 1, 2:4], shared.arrays["next_obs1"][1, 0, 0:3]):
        assert block.flags.c_contiguous


def test_two_mappings_of_one_segment_see_each_others_writes(segment):
    layout, fd, engine_side = segment
    worker_side = SharedArrays(layout, fd)  # what a worker maps from the inherited fd
    engine_side.arrays["action"][2] = [3, 1, 4, 1]  # column 2's actions
    engine_side.control[1, protocol.SLOT] = 1
    engine_side.control[1, protocol.COL] = 2
    worker_side.arrays["next_obs0"][1, 2, 3] = [1.5, 2.5, 3.5]
    worker_side.arrays["obs1"][1, 3, 2] = -7  # column T: carried over to the next batch
    worker_side.arrays["terminated"][1, 2, 3] = True
    worker_side.control[1, protocol.DONE] = 17
    assert worker_side.arrays["action"][2].tolist() == [3, 1, 4, 1]
    assert worker_side.control[1, protocol.SLOT] == 1 and worker_side.control[1, protocol.COL] == 2
    assert engine_side.arrays["next_obs0"][1, 2, 3].tolist() == [1.5, 2.5, 3.5]
    assert engine_side.arrays["obs1"][1, 3].tolist() == [0, 0, -7, 0]
    assert np.flatnonzero(engine_side.arrays["terminated"]).tolist() == [1 * 12 + 2 * 4 + 3]
    expected = [0] * CONTROL_WORDS
    expected[protocol.DONE], expected[protocol.SLOT], expected[protocol.COL] = 17, 1, 2
    assert engine_side.control[1].tolist() == expected
    assert engine_side.control[0].tolist() == [0] * CONTROL_WORDS
    # fields do not overlap: nothing else changed
    changed = {name: int(np.count_nonzero(a)) for name, a in engine_side.arrays.items()}
    assert changed == dict.fromkeys(changed, 0) | {"action": 4, "next_obs0": 3, "obs1": 1, "terminated": 1}


def test_the_mapping_outlives_the_fd():
    layout = Layout.plan(OBS, ACTION, num_envs=2, num_lanes=1)
    fd = create_segment(layout.size)
    shared = SharedArrays(layout, fd)
    os.close(fd)
    shared.arrays["reward"][1, 0] = [0.5, -1.0]
    assert shared.arrays["reward"][1, 0].tolist() == [0.5, -1.0]


def test_obs_lists_the_observation_leaves_in_order(segment):
    _, _, shared = segment
    obs, next_obs = shared.obs("obs"), shared.obs("next_obs")
    assert [a.shape for a in obs] == [(2, 4, 4, 3), (2, 4, 4)]
    assert [a.shape for a in next_obs] == [(2, 3, 4, 3), (2, 3, 4)]
    assert obs[0] is shared.arrays["obs0"] and obs[1] is shared.arrays["obs1"]
    assert next_obs[0] is shared.arrays["next_obs0"] and next_obs[1] is shared.arrays["next_obs1"]
    assert [a is b for a, b in zip(shared.obs(), obs)] == [True, True]  # "obs" by default


# --------------------------------------------------------------------------- framing


def test_a_frame_is_a_little_endian_length_then_a_pickle():
    data = protocol.frame({"a": [1, 2]})
    (size,) = struct.unpack("<I", data[:4])
    assert size == len(data) - 4
    assert pickle.loads(data[4:]) == {"a": [1, 2]}


def test_parse_frame_round_trips_and_waits_for_the_whole_frame():
    message = {"type": "ValueError", "env_index": 3, "text": "x" * 300}
    data = protocol.frame(message)
    for cut in range(len(data)):
        assert protocol.parse_frame(bytearray(data[:cut]), 0) is None, cut
    assert protocol.parse_frame(bytearray(data), 0) == (message, len(data))


def test_parse_frame_reads_back_to_back_frames_from_an_offset():
    first, second = protocol.frame(("hello", 1)), protocol.frame(None)
    buf = bytearray(b"junk" + first + second + second[:3])
    msg, end = protocol.parse_frame(buf, 4)
    assert (msg, end) == (("hello", 1), 4 + len(first))
    msg, end2 = protocol.parse_frame(buf, end)
    assert (msg, end2) == (None, end + len(second))
    assert protocol.parse_frame(buf, end2) is None  # only 3 bytes of the next frame so far
    assert protocol.parse_frame(buf, len(buf)) is None


def test_recv_frame_reads_a_frame_sent_in_pieces_over_a_socket_pair():
    a, b = socket.socketpair()
    try:
        data = protocol.frame({"obs": list(range(100))})
        a.sendall(data[:3])
        a.sendall(data[3:50])
        a.sendall(data[50:])
        assert protocol.recv_frame(b) == {"obs": list(range(100))}
        a.sendall(protocol.OK + protocol.CLOSE)
        assert protocol.recv_exact(b, 2) == b"kc"
        a.close()
        with pytest.raises(EOFError, match="control socket closed"):
            protocol.recv_exact(b, 1)
    finally:
        a.close()
        b.close()


def test_control_words_are_distinct_and_fit_in_the_control_line_and_codes_in_two_bits():
    words = [protocol.CMD, protocol.DONE, protocol.W_ASLEEP, protocol.E_ASLEEP, protocol.SLOT, protocol.COL]
    assert len(set(words)) == len(words)
    assert all(0 <= w < CONTROL_WORDS for w in words)
    for code in (protocol.STEP_CODE, protocol.RESET_CODE):
        assert 0 < code < 4
        word = 12345 * 4 + code
        assert (word // 4, word % 4) == (12345, code)
    assert protocol.STEP_CODE != protocol.RESET_CODE
    assert len({protocol.CLOSE, protocol.OK, protocol.ERROR}) == 3
    assert all(len(b) == 1 for b in (protocol.CLOSE, protocol.OK, protocol.ERROR))


# --------------------------------------------------------------------------- spin_budget


@pytest.fixture
def quiet(monkeypatch):
    """A machine whose other programs take no core (the 1-minute load average 0): the
    default spins only by the cores, whatever this machine's load is now."""
    monkeypatch.setattr(protocol.os, "getloadavg", lambda: (0.0, 0.0, 0.0))


@pytest.mark.parametrize("machine", ["x86_64", "AMD64", "amd64"])
def test_spin_budget_spins_by_default_on_x86_64(machine, monkeypatch, quiet):
    monkeypatch.delenv("AIOCOLLECT_SPIN", raising=False)
    monkeypatch.setattr(protocol.platform, "machine", lambda: machine)
    assert protocol.spin_budget() == protocol.SPIN_S
    assert protocol.SPIN_S > 0


@pytest.mark.parametrize("machine", ["arm64", "aarch64", "ppc64le", "i686"])
def test_spin_budget_never_spins_by_default_off_x86_64(machine, monkeypatch):
    monkeypatch.delenv("AIOCOLLECT_SPIN", raising=False)
    monkeypatch.setattr(protocol.platform, "machine", lambda: machine)
    assert protocol.spin_budget() == 0.0


@pytest.mark.parametrize(("cores", "workers", "engine", "worker"), [
    (2, 1, protocol.SPIN_S, protocol.SPIN_S),
    (2, 2, 0.0, protocol.WORKER_SPIN_S),
    (16, 15, protocol.SPIN_S, protocol.SPIN_S),
    (16, 31, 0.0, protocol.WORKER_SPIN_S),
])
def test_with_more_processes_than_cores_only_the_workers_spin(cores, workers, engine, worker, monkeypatch, quiet):
    monkeypatch.delenv("AIOCOLLECT_SPIN", raising=False)
    monkeypatch.setattr(protocol.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(protocol, "usable_cores", lambda: cores)
    assert (protocol.spin_budget(workers), protocol.worker_spin_budget(workers)) == (engine, worker)
    monkeypatch.setattr(protocol.platform, "machine", lambda: "arm64")
    assert (protocol.spin_budget(workers), protocol.worker_spin_budget(workers)) == (0.0, 0.0)
    for off in ("0", "off"):
        monkeypatch.setenv("AIOCOLLECT_SPIN", off)
        assert (protocol.spin_budget(workers), protocol.worker_spin_budget(workers)) == (0.0, 0.0)
    monkeypatch.setenv("AIOCOLLECT_SPIN", "1")
    assert (protocol.spin_budget(workers), protocol.worker_spin_budget(workers)) == (protocol.SPIN_S,) * 2


@pytest.mark.parametrize(("cores", "workers", "load", "engine"), [
    (2, 1, 0.4, protocol.SPIN_S),  # (background noise: half a core of slack)
    (2, 1, 0.7, 0.0),  # (another program takes most of a core: the engine's or the worker's)
    (16, 15, 0.3, protocol.SPIN_S),
    (16, 8, 6.0, protocol.SPIN_S),
    (16, 8, 8.0, 0.0),
])
def test_the_default_leaves_the_cores_other_programs_take(cores, workers, load, engine, monkeypatch):
    monkeypatch.delenv("AIOCOLLECT_SPIN", raising=False)
    monkeypatch.setattr(protocol.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(protocol, "usable_cores", lambda: cores)
    monkeypatch.setattr(protocol.os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(protocol, "runnable_now", lambda: None)  # (the load average alone)
    assert protocol.spin_budget(workers) == engine
    assert protocol.worker_spin_budget(workers) == (engine or protocol.WORKER_SPIN_S)
    monkeypatch.setattr(protocol, "runnable_now", lambda: 1 + round(load))  # (busy now as on average)
    assert protocol.spin_budget(workers) == engine


@pytest.mark.parametrize(("load", "now", "busy"), [
    (3.0, 1, 0.0),  # (the load average remembers this program's own recent work: idle now)
    (3.0, 2, 1.0),
    (0.2, 9, 0.2),  # (a burst right now: the minute's average says it is not the rule)
    (3.0, None, 3.0),  # (no /proc/loadavg: the average alone)
])
def test_what_the_machine_runs_besides_is_the_lesser_of_the_minute_and_the_instant(load, now, busy, monkeypatch):
    monkeypatch.setattr(protocol.os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(protocol, "runnable_now", lambda: now)
    assert protocol.busy_elsewhere() == busy


def test_the_runnable_tasks_are_read_off_this_machine():
    now = protocol.runnable_now()
    assert now is None or now >= 1  # (on Linux at least the thread asking)


def test_a_machine_with_no_load_average_counts_as_quiet(monkeypatch):
    def no_load():
        raise OSError("no load average")
    monkeypatch.delenv("AIOCOLLECT_SPIN", raising=False)
    monkeypatch.setattr(protocol.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(protocol, "usable_cores", lambda: 2)
    monkeypatch.setattr(protocol.os, "getloadavg", no_load)
    assert protocol.spin_budget(1) == protocol.SPIN_S


@pytest.mark.parametrize("env", [None, "0", "1"])
def test_the_spin_keyword_overrides_the_variable_and_the_machine(env, monkeypatch):
    if env is None:
        monkeypatch.delenv("AIOCOLLECT_SPIN", raising=False)
    else:
        monkeypatch.setenv("AIOCOLLECT_SPIN", env)
    for machine, load in (("arm64", 0.0), ("x86_64", 9.0)):
        monkeypatch.setattr(protocol.platform, "machine", lambda m=machine: m)
        monkeypatch.setattr(protocol.os, "getloadavg", lambda v=load: (v, v, v))
        assert (protocol.spin_budget(4, True), protocol.worker_spin_budget(4, True)) == (protocol.SPIN_S,) * 2
        assert (protocol.spin_budget(4, False), protocol.worker_spin_budget(4, False)) == (0.0, 0.0)


@pytest.mark.parametrize(("value", "expected"), [
    ("", 0.0), ("0", 0.0), (" 0", 0.0), ("false", 0.0), ("FALSE", 0.0), ("no", 0.0), ("No", 0.0),
    ("off", 0.0), (" OFF ", 0.0),
    ("1", protocol.SPIN_S), (" 1 ", protocol.SPIN_S), ("true", protocol.SPIN_S), ("yes", protocol.SPIN_S),
    ("on", protocol.SPIN_S), ("2", protocol.SPIN_S), ("anything", protocol.SPIN_S),
])
def test_aiocollect_spin_overrides_the_machine(value, expected, monkeypatch):
    monkeypatch.setenv("AIOCOLLECT_SPIN", value)
    for machine in ("arm64", "x86_64"):
        monkeypatch.setattr(protocol.platform, "machine", lambda m=machine: m)
        assert protocol.spin_budget() == expected, machine


# --------------------------------------------------------------------------- ring


@pytest.mark.parametrize("blocking", [True, False])
def test_ring_never_blocks_nor_raises_on_a_full_socket(blocking):
    """Unread doorbells may fill a socket; the sleeper wakes anyway, so ringing again is a no-op."""
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(blocking)
        full = False
        for _ in range(100_000):
            protocol.ring(a)
            try:
                a.send(b"x", socket.MSG_DONTWAIT)
            except BlockingIOError:
                full = True
                break
        assert full, "the buffer never filled: the test proves nothing"
        for _ in range(1000):
            protocol.ring(a)
        assert b.recv(1) == protocol.OK


def test_ring_raises_when_the_other_end_is_gone():
    a, b = socket.socketpair()
    b.close()
    with a, pytest.raises(OSError):
        for _ in range(3):
            protocol.ring(a)

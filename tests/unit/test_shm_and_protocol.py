"""Shared memory and the engine <-> worker wire format, in this process only.

``_workers.shm``: ``Layout.plan`` (field order, 64-byte alignment, the control block),
``create_segment`` + ``SharedArrays`` over a memfd (two mappings of one segment see the
same bytes, as engine and worker do), ``rows`` views, ``set_aside_resets``.
``_workers.protocol``: ``frame``/``parse_frame`` (whole, partial and back-to-back frames),
``recv_frame`` over a socket pair, and ``spin_budget`` (free cores, ``AIOCOLLECT_SPIN``).
Every fd opened here is closed.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct

import numpy as np
import pytest

from aiocollect._workers import protocol
from aiocollect._workers.shm import CONTROL_WORDS, Field, Layout, SharedArrays, create_segment, set_aside_resets

OBS = [(np.dtype(np.float32), (3,)), (np.dtype(np.int64), ())]
ACTION = (np.dtype(np.int64), ())


@pytest.fixture
def segment():
    """A layout for 4 envs in 2 workers, its memfd and one mapping of it; the fd is closed after."""
    layout = Layout.plan(OBS, ACTION, num_envs=4, num_workers=2)
    fd = create_segment(layout.size)
    try:
        yield layout, fd, SharedArrays(layout, fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- Layout


def test_layout_lays_the_fields_out_in_order_each_on_its_own_cache_lines():
    layout = Layout.plan(OBS, ACTION, num_envs=4, num_workers=2)
    assert [(f.name, f.dtype, f.shape, f.offset) for f in layout.fields] == [
        ("obs0", "<f4", (4, 3), 0),  # 48 bytes, padded to 64
        ("reset_obs0", "<f4", (4, 3), 64),
        ("obs1", "<i8", (4,), 128),
        ("reset_obs1", "<i8", (4,), 192),
        ("action", "<i8", (4,), 256),
        ("reward", "<f4", (4,), 320),
        ("terminated", "|b1", (4,), 384),
        ("truncated", "|b1", (4,), 448),
        ("pre_reset", "|b1", (4,), 512),
        ("reset_mask", "|b1", (4,), 576),
        ("seed", "<i8", (4,), 640),
        ("seed_set", "|b1", (4,), 704),
    ]
    assert layout.control == Field("control", "<i8", (2, CONTROL_WORDS), 768)
    assert CONTROL_WORDS == 8  # one 64-byte line of int64 per worker
    assert layout.size == 768 + 2 * 64
    assert layout.num_obs == 2


def test_a_field_larger_than_a_line_takes_whole_lines():
    layout = Layout.plan([(np.dtype(np.float64), (5, 2))], (np.dtype(np.float32), (3,)), num_envs=7, num_workers=3)
    fields = {f.name: f for f in layout.fields}
    assert fields["obs0"].nbytes == 7 * 5 * 2 * 8 == 560
    assert fields["reset_obs0"].offset == 576  # 560 rounded up to 9 lines
    assert fields["action"].offset == 1152 and fields["action"].nbytes == 84
    assert fields["reward"].offset == 1280  # 84 bytes: two lines
    assert all(f.offset % 64 == 0 for f in layout.fields) and layout.control.offset % 64 == 0
    for a, b in zip(layout.fields[:-1], layout.fields[1:], strict=True):
        assert a.offset + a.nbytes <= b.offset
    assert layout.size == layout.control.offset + 3 * 64


def test_an_empty_field_still_gets_its_own_line():
    layout = Layout.plan([(np.dtype(np.float32), (0,))], ACTION, num_envs=2, num_workers=1)
    fields = {f.name: f for f in layout.fields}
    assert fields["obs0"].nbytes == 0
    assert (fields["obs0"].offset, fields["reset_obs0"].offset, fields["action"].offset) == (0, 64, 128)


def test_a_layout_survives_pickling():
    layout = Layout.plan(OBS, ACTION, num_envs=4, num_workers=2)
    assert pickle.loads(pickle.dumps(layout)) == layout


# --------------------------------------------------------------------------- segment and arrays


def test_a_new_segment_has_the_size_asked_for_and_is_not_inherited():
    fd = create_segment(4096 + 3)
    try:
        assert os.fstat(fd).st_size == 4096 + 3
        assert os.get_inheritable(fd) is False
    finally:
        os.close(fd)


def test_shared_arrays_are_zeroed_views_with_the_layouts_shapes_and_dtypes(segment):
    layout, _, shared = segment
    assert list(shared.arrays) == [f.name for f in layout.fields]
    for f in layout.fields:
        a = shared.arrays[f.name]
        assert a.shape == f.shape and a.dtype == np.dtype(f.dtype), f.name
        assert not a.any(), f.name
        assert a.ctypes.data % 64 == 0, f.name
    assert shared.control.shape == (2, CONTROL_WORDS) and shared.control.dtype == np.int64
    assert not shared.control.any()


def test_two_mappings_of_one_segment_see_each_others_writes(segment):
    layout, fd, engine_side = segment
    worker_side = SharedArrays(layout, fd)  # what a worker maps from the inherited fd
    engine_side.arrays["action"][:] = [3, 1, 4, 1]
    worker_side.arrays["obs0"][2] = [1.5, 2.5, 3.5]
    worker_side.arrays["terminated"][3] = True
    worker_side.control[1, protocol.DONE] = 17
    assert worker_side.arrays["action"].tolist() == [3, 1, 4, 1]
    assert engine_side.arrays["obs0"][2].tolist() == [1.5, 2.5, 3.5]
    assert engine_side.arrays["terminated"].tolist() == [False, False, False, True]
    assert engine_side.control[1].tolist() == [0, 17, 0, 0, 0, 0, 0, 0]
    assert engine_side.control[0].tolist() == [0] * CONTROL_WORDS
    # fields do not overlap: nothing else changed
    assert not engine_side.arrays["reset_obs0"].any() and not engine_side.arrays["truncated"].any()


def test_the_mapping_outlives_the_fd():
    layout = Layout.plan(OBS, ACTION, num_envs=2, num_workers=1)
    fd = create_segment(layout.size)
    shared = SharedArrays(layout, fd)
    os.close(fd)
    shared.arrays["reward"][:] = [0.5, -1.0]
    assert shared.arrays["reward"].tolist() == [0.5, -1.0]


def test_rows_are_views_of_a_workers_rows(segment):
    _, _, shared = segment
    rows = shared.rows(2, 4)
    assert set(rows) == set(shared.arrays)
    assert rows["obs0"].shape == (2, 3) and rows["seed"].shape == (2,)
    rows["seed"][:] = [11, 12]
    rows["obs0"][0] = 9.0
    assert shared.arrays["seed"].tolist() == [0, 0, 11, 12]
    assert shared.arrays["obs0"][:, 0].tolist() == [0, 0, 9, 0]
    assert np.shares_memory(rows["action"], shared.arrays["action"])


def test_obs_lists_the_observation_leaves_in_order(segment):
    _, _, shared = segment
    rows = shared.rows(1, 3)
    obs, reset_obs = shared.obs(rows), shared.obs(rows, "reset_obs")
    assert [a.shape for a in obs] == [(2, 3), (2,)]
    assert obs[0] is rows["obs0"] and obs[1] is rows["obs1"]
    assert reset_obs[0] is rows["reset_obs0"] and reset_obs[1] is rows["reset_obs1"]


def test_set_aside_resets_moves_fresh_observations_aside_and_restores_the_final_ones(segment):
    _, _, shared = segment
    rows = shared.rows(0, 4)
    obs, reset_obs = shared.obs(rows), shared.obs(rows, "reset_obs")
    obs[0][:] = np.arange(12, dtype=np.float32).reshape(4, 3)  # the step's results
    obs[1][:] = [10, 11, 12, 13]
    idx = np.array([1, 3])
    final = [a[idx] for a in obs]  # taken before the worker resets envs 1 and 3
    obs[0][idx] = -1.0  # the reset's first observations
    obs[1][idx] = [-5, -7]
    set_aside_resets(obs, reset_obs, rows["pre_reset"], idx, final)
    assert obs[0].tolist() == np.arange(12, dtype=np.float32).reshape(4, 3).tolist()
    assert obs[1].tolist() == [10, 11, 12, 13]
    assert reset_obs[0].tolist() == [[0, 0, 0], [-1, -1, -1], [0, 0, 0], [-1, -1, -1]]
    assert reset_obs[1].tolist() == [0, -5, 0, -7]
    assert rows["pre_reset"].tolist() == [False, True, False, True]


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


def test_command_words_fit_in_the_control_line_and_codes_in_two_bits():
    assert {protocol.CMD, protocol.DONE, protocol.W_ASLEEP, protocol.E_ASLEEP} == {0, 1, 2, 3}
    assert max(protocol.CMD, protocol.DONE, protocol.W_ASLEEP, protocol.E_ASLEEP) < CONTROL_WORDS
    for code in (protocol.STEP_CODE, protocol.RESET_CODE):
        word = 12345 * 4 + code
        assert (word // 4, word % 4) == (12345, code)
    assert protocol.STEP_CODE != protocol.RESET_CODE
    assert len({protocol.CLOSE, protocol.OK, protocol.ERROR}) == 3
    assert all(len(b) == 1 for b in (protocol.CLOSE, protocol.OK, protocol.ERROR))


# --------------------------------------------------------------------------- spin_budget


def test_spin_budget_follows_free_cores_on_x86_64(monkeypatch):
    monkeypatch.delenv("AIOCOLLECT_SPIN", raising=False)
    monkeypatch.setattr(protocol.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(protocol.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert protocol.spin_budget(1) == protocol.SPIN_S
    assert protocol.spin_budget(3) == protocol.SPIN_S  # 3 workers + the engine on 4 cores
    assert protocol.spin_budget(4) == 0.0  # one process too many
    monkeypatch.setattr(protocol.platform, "machine", lambda: "AMD64")
    assert protocol.spin_budget(3) == protocol.SPIN_S


def test_spin_budget_counts_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.delenv("AIOCOLLECT_SPIN", raising=False)
    monkeypatch.setattr(protocol.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(protocol.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(protocol.os, "sched_getaffinity", lambda pid: {5, 6}, raising=False)
    assert protocol.spin_budget(1) == protocol.SPIN_S
    assert protocol.spin_budget(2) == 0.0


def test_spin_budget_falls_back_on_cpu_count_without_affinity(monkeypatch):
    monkeypatch.delenv("AIOCOLLECT_SPIN", raising=False)
    monkeypatch.setattr(protocol.platform, "machine", lambda: "x86_64")
    monkeypatch.delattr(protocol.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(protocol.os, "cpu_count", lambda: 3)
    assert protocol.spin_budget(2) == protocol.SPIN_S
    assert protocol.spin_budget(3) == 0.0


@pytest.mark.parametrize("machine", ["arm64", "aarch64", "ppc64le"])
def test_spin_budget_never_spins_by_default_off_x86_64(machine, monkeypatch):
    monkeypatch.delenv("AIOCOLLECT_SPIN", raising=False)
    monkeypatch.setattr(protocol.platform, "machine", lambda: machine)
    monkeypatch.setattr(protocol.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert protocol.spin_budget(1) == 0.0


@pytest.mark.parametrize(("value", "expected"), [
    ("1", protocol.SPIN_S), (" 1 ", protocol.SPIN_S), ("0", 0.0), (" 0", 0.0), ("", 0.0),
])
def test_aiocollect_spin_overrides_cores_and_machine(value, expected, monkeypatch):
    monkeypatch.setenv("AIOCOLLECT_SPIN", value)
    monkeypatch.setattr(protocol.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(protocol.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert protocol.spin_budget(16) == expected
    monkeypatch.setattr(protocol.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(protocol.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert protocol.spin_budget(1) == expected

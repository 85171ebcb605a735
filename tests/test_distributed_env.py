"""torchrun's settings given by hand (core/common/launch.py): one line naming the variable, before any
work, from the CLI (any command, `--help` too) and from a packaged train_gpt.py."""

from __future__ import annotations

import socket

import pytest

from core.common.errors import PgolfError
from core.common.launch import Launch, launch, reach_rank_0, rendezvous_failed
from core.config.presets import preset
from core.runs.train_script import script
from tests.support.backends import free_port, needs
from tests.support.cli import assert_one_line_error, cli, data_flags
from tests.support.runs import run_alone

TORCHRUN_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
RENDEZVOUS = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}

# (the environment set by hand, the variable the error names): the issue's cases, then others
ISSUE_CASES = [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc'"),
    ({"WORLD_SIZE": "1.5"}, "WORLD_SIZE='1.5'"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0'"),
    ({"WORLD_SIZE": "-1"}, "WORLD_SIZE='-1'"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 without RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT"),
    ({"RANK": "abc"}, "RANK='abc'"),
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, "WORLD_SIZE=2 without MASTER_ADDR, MASTER_PORT"),
    ({"LOCAL_RANK": "abc"}, "LOCAL_RANK='abc'"),
    ({"WORLD_SIZE": "1", "RANK": "3"}, "RANK='3' must be a whole number below WORLD_SIZE=1"),
]
BAD = [
    *ISSUE_CASES,
    ({"WORLD_SIZE": ""}, "WORLD_SIZE=''"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "h"}, "without MASTER_PORT"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", **RENDEZVOUS, "MASTER_PORT": "x"}, "MASTER_PORT='x'"),
    ({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0", **RENDEZVOUS}, "RANK='2' must be a whole number below"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1'"),
    ({"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "2", **RENDEZVOUS}, "LOCAL_RANK='2'"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3", **RENDEZVOUS},
     "LOCAL_WORLD_SIZE='3'"),
]  # fmt: skip


@pytest.mark.parametrize(("env", "named"), BAD)
def test_a_bad_setting_is_one_error_naming_it_and_torchrun(env, named):
    with pytest.raises(PgolfError) as caught:
        launch(env)
    assert named in str(caught.value) and "torchrun" in str(caught.value) and "\n" not in str(caught.value)


def test_torchruns_own_settings_and_none_at_all_are_accepted():
    assert launch({}) == Launch(1, 0, 0, 1)
    assert launch({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}) == Launch()
    eight = {"WORLD_SIZE": "16", "RANK": "11", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", **RENDEZVOUS}
    assert launch(eight) == Launch(16, 11, 3, 8)


@pytest.mark.slow
@pytest.mark.parametrize(("env", "named"), ISSUE_CASES)
def test_the_cli_refuses_a_bad_setting_before_any_command(env, named, monkeypatch):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    for args in (("--help",), ("eval", "--help")):
        result = cli(*args, env=env)
        assert_one_line_error(result, named, "torchrun")
        assert result.returncode == 1 and result.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize(("env", "named"), ISSUE_CASES[::2])
def test_a_packaged_script_refuses_a_bad_setting_before_any_work(env, named, tmp_path, monkeypatch):
    """Refused before the config, torch or data (a second or two a process: no torch import); it was a
    ZeroDivisionError, or torch's tracebacks."""
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    result = run_alone(script(preset("smoke")), tmp_path, **env)
    assert_one_line_error(result, named, "torchrun", packaged=True)


# ------------------------------------------------- a rank that never comes
HERE = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
START_ALL = "start all {n} (`torchrun --nproc_per_node={n}` starts them together)"


@pytest.mark.parametrize(
    ("place", "detail", "missing"),
    [
        (Launch(2, 0, 0, 2), "Timed out after 6 seconds waiting for clients. 1/2 clients joined.", "rank 1 never came"),
        (Launch(4, 0, 0, 4), "Timed out after 6 seconds waiting for clients. 1/4 clients joined.", "ranks 1 to 3 never came"),
        (Launch(4, 0, 0, 4), "Timed out after 6 seconds waiting for clients. 3/4 clients joined.", "1 of the 4 ranks never came"),
        (Launch(2, 1, 1, 2), "The client socket has timed out after 5000ms while trying to connect to (h, 1)",
         "rank 0 never came"),
    ],
)  # fmt: skip
def test_the_line_names_the_ranks_that_never_came_and_the_timeout(place, detail, missing):
    line = str(rendezvous_failed(place, 5, detail, HERE))
    n = place.world_size
    assert line == (
        f"rank {place.rank} of WORLD_SIZE={n}: {missing} to the rendezvous at 127.0.0.1:29500 within 5 s "
        f"(collective_timeout_seconds): {START_ALL.format(n=n)}"
    )


def test_a_rank_reaches_rank_0_or_says_it_never_came_within_the_timeout():
    port = free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    with pytest.raises(
        PgolfError,
        match=rf"^rank 1 of WORLD_SIZE=2: rank 0 never came to the rendezvous at 127.0.0.1:{port} within 0.5 s",
    ):
        reach_rank_0(Launch(2, 1, 1, 2), 0.5, env)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", port))
        listening.listen()
        reach_rank_0(Launch(2, 1, 1, 2), 0.5, env)  # at once: it is there
    reach_rank_0(Launch(2, 0, 0, 2), 0.5, env)  # rank 0 waits in the framework's own rendezvous


@pytest.mark.slow
@needs("cuda")
@pytest.mark.parametrize(("rank", "missing"), [(0, "rank 1 never came"), (1, "rank 0 never came")])
def test_a_second_rank_that_never_comes_is_one_line_after_the_timeout(sotu_dataset, tmp_path, rank, missing):
    """WORLD_SIZE=2 by hand and one process: a DistStoreError traceback (rank 0) or a C++ stack at each
    connect (rank 1) before; one line naming the missing rank, the address and the timeout now."""
    port = str(free_port())
    env = {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": port}  # fmt: skip
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--collective-timeout-seconds", "2",
                 "--out-dir", str(tmp_path), *data_flags(sotu_dataset), env=env)  # fmt: skip
    assert_one_line_error(
        result,
        f"error: rank {rank} of WORLD_SIZE=2: {missing} to the rendezvous at 127.0.0.1:{port} within 2 s",
    )

"""Resuming a run whose saved config predates keys added since (Acme options, layout,
rate decay, feature standardisation), and the replay layout a new run pins so that a later
default cannot change it."""

import json
import os

import pytest

from agents.d4pg.config import SAVED_CONFIG_FALLBACKS, D4PGConfig
from launch.cli import app, d4pg_flags
from launch.d4pg import program as d4pg_program
from launch.runtime.errors import LaunchError
from launch.runtime.run_dir import RunDirError
from tests.launch import d4pg_support as s

pytestmark = pytest.mark.timeout(120)

ACME_OPTIONS = ("act_with_target_policy", "network_init", "short_transitions_from_first_state")
LAYOUT_KEYS = (
    "transitions_per_item",
    "item_pool_size",
    "shuffle_buffer_transitions",
    "row_mixing",
)
DECAY_KEYS = (
    "lr_decay_updates",
    "lr_final_scale",
    "lr_decay_start_fraction",
    "policy_lr_final_scale",
    "critic_lr_final_scale",
)
OBSERVATION_KEYS = ("normalize_observations",)
TARGET_KEYS = ("target_update_rate",)
NOISE_KEYS = ("noise_beta", "sigma_final_scale")
NETWORK_KEYS = ("critic_layer_norm",)
LATER_KEYS = (
    ACME_OPTIONS
    + LAYOUT_KEYS
    + DECAY_KEYS
    + OBSERVATION_KEYS
    + TARGET_KEYS
    + NOISE_KEYS
    + NETWORK_KEYS
)


def _stored_run(tmp_path, task: str, config: dict) -> str:
    """A run directory holding only the run.json a launch of `config` on `task` wrote."""
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    identity = {**d4pg_program.identity(task, config), "launches": 1}
    with open(os.path.join(run_dir, "run.json"), "w", encoding="utf-8") as f:
        json.dump(identity, f)
    return run_dir


def _old_run(tmp_path, **config_changes) -> str:
    """A run directory as a launch before the later keys wrote it (run.json only)."""
    config = D4PGConfig.from_overrides(d4pg_program.PRESETS["quick"]).to_dict()
    for key in LATER_KEYS:
        del config[key]
    config.update(config_changes)
    return _stored_run(tmp_path, "cartpole:swingup", config)


def _resolve(run_dir, *flags, **overrides):
    argv = ["launch", "d4pg", "--run-dir", run_dir, *flags]
    args = app.build_parser(argv).parse_args(argv)
    return d4pg_flags.resolve(args, {k: str(v) for k, v in overrides.items()})


def test_the_acme_options_change_what_a_run_is():
    assert not set(LATER_KEYS) & d4pg_program.RESUMABLE_CONFIG_KEYS
    assert set(SAVED_CONFIG_FALLBACKS) == set(LATER_KEYS)


def test_an_old_run_resumes_with_the_behaviour_it_had(tmp_path):
    run_dir = _old_run(tmp_path, sigma=0.2)
    _, config, _, _, resuming, _, _ = _resolve(run_dir)
    assert resuming and config.sigma == 0.2
    for key, value in SAVED_CONFIG_FALLBACKS.items():
        assert getattr(config, key) == value, key


@pytest.mark.parametrize(
    "key, value",
    [
        ("act_with_target_policy", "true"),
        ("network_init", "acme"),
        ("short_transitions_from_first_state", "true"),
        ("transitions_per_item", "16"),  # Another table signature.
        ("critic_layer_norm", "every"),  # Other critic variables.
    ],
)
def test_resuming_with_another_value_is_refused(tmp_path, key, value):
    run_dir = _old_run(tmp_path)
    with pytest.raises(RunDirError, match=f"(?s)config.{key}: the run has .*new --run-dir"):
        _resolve(run_dir, **{key: value})


def test_the_fallbacks_not_todays_defaults_decide(tmp_path, monkeypatch):
    """Once a default changes (to Acme's, say), old runs must keep what they did."""
    monkeypatch.setitem(SAVED_CONFIG_FALLBACKS, "network_init", "acme")  # != the default.
    run_dir = _old_run(tmp_path)
    _, config, _, _, resuming, _, _ = _resolve(run_dir)
    assert resuming and config.network_init == "acme"
    with pytest.raises(RunDirError, match="config.network_init: the run has 'acme'"):
        _resolve(run_dir, network_init="lecun_uniform")


@pytest.mark.parametrize("replicas, group", [("cpu", 16), ("cpu:8", 8)])
def test_a_new_run_stores_the_layout_its_replicas_share_of_the_batch_allows(
    tmp_path, replicas, group
):
    """Unset, 16 transitions per item, as far as each replica's share of 64 allows; the
    stored value is the number, so the run resumes with it whatever the default becomes."""
    _, config, identity, _, resuming, _, _ = _resolve(
        str(tmp_path / "run"), "--learner-replicas", replicas
    )
    assert not resuming
    assert config.transitions_per_item == group
    assert identity["config"]["transitions_per_item"] == group


def test_a_layout_that_splits_items_across_replicas_is_refused(tmp_path):
    with pytest.raises(LaunchError, match="each of the 8 learner replicas 8 transitions"):
        _resolve(str(tmp_path / "run"), "--learner-replicas", "cpu:8", transitions_per_item=16)


def test_a_program_built_in_python_gives_every_node_one_layout_for_its_learner():
    """Without the CLI: 2 workers x `cpu` split the tiny batch of 16 into 8 per replica."""
    for workers, group in ((1, 16), (2, 8)):
        program = s.tiny_program(learner_workers=workers)
        layouts = {n.kwargs["config"]["transitions_per_item"] for n in program.nodes}
        assert layouts == {group}, workers


@pytest.mark.parametrize("steps, span", [("100000", 50_000), ("500000", 250_000)])
def test_a_new_quick_run_decays_its_rates_over_its_own_budget(tmp_path, steps, span):
    """32 samples per insert at batch 64: half an update per actor step, stored as a number."""
    _, config, identity, _, _, _, _ = _resolve(str(tmp_path / "run"), "--steps", steps)
    assert config.lr_decay_updates == span
    assert identity["config"]["lr_decay_updates"] == span


def test_a_given_decay_span_wins_and_the_paper_preset_keeps_constant_rates(tmp_path):
    _, config, _, _, _, _, _ = _resolve(
        str(tmp_path / "a"), "--steps", "500000", lr_decay_updates=7
    )
    assert config.lr_decay_updates == 7
    _, paper, _, _, _, _, _ = _resolve(str(tmp_path / "b"), "--preset", "paper")
    assert paper.lr_decay_updates == 0


def test_a_resumed_run_keeps_the_decay_span_it_started_with(tmp_path):
    """Resuming with a larger --steps must not stretch the schedule the run has followed."""
    run_dir = _old_run(tmp_path, lr_decay_updates=50_000, lr_final_scale=0.1)
    _, config, _, _, resuming, _, _ = _resolve(run_dir, "--steps", "300000")
    assert resuming and config.lr_decay_updates == 50_000


def test_a_finger_run_resumes_with_its_own_critic_not_todays_task_values(tmp_path):
    """A run stored before the preset's finger:spin values keeps its config on resume."""
    quick = D4PGConfig.from_overrides(d4pg_program.PRESETS["quick"])
    run_dir = _stored_run(tmp_path, "finger:spin", quick.with_pinned_layout().to_dict())
    _, resumed, *_ = _resolve(run_dir)
    assert resumed.critic_layers == (128, 128) and resumed.samples_per_insert == 32.0
    _, fresh, *_ = _resolve(str(tmp_path / "new"), "--env", "finger:spin")
    assert fresh.critic_layers == (256, 256) and fresh.samples_per_insert == 64.0

"""D4PGConfig: defaults, string overrides (as the CLI passes them), JSON round trip."""

import json

import pytest

from agents.d4pg.config import SAVED_CONFIG_FALLBACKS, D4PGConfig

pytestmark = pytest.mark.timeout(60)


def test_published_defaults():
    c = D4PGConfig()
    assert (c.discount, c.batch_size, c.n_step, c.sigma) == (0.99, 256, 5, 0.3)
    assert c.policy_layers == (256, 256, 256) and c.critic_layers == (512, 512, 256)
    assert (c.num_atoms, c.vmin, c.vmax) == (51, None, None)  # Derived from the task.
    assert (c.policy_lr, c.critic_lr, c.target_update_period) == (1e-4, 1e-4, 100)
    assert (c.clipping, c.max_gradient_norm, c.dqda_clipping) == (True, 40.0, 1.0)  # Acme.
    assert (c.max_replay_size, c.min_replay_size, c.samples_per_insert) == (1_000_000, 1000, 32.0)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"batch_size": "128"}, {"batch_size": 128}),
        ({"policy_layers": "64,64"}, {"policy_layers": (64, 64)}),
        ({"policy_layers": "(32, 16)"}, {"policy_layers": (32, 16)}),
        ({"critic_layers": [8]}, {"critic_layers": (8,)}),
        ({"clipping": "false", "from_pixels": "True"}, {"clipping": False, "from_pixels": True}),
        (
            {"min_replay_size": "1e3", "max_replay_size": "100_000"},
            {"min_replay_size": 1000, "max_replay_size": 100_000},
        ),
        ({"policy_lr": "3e-4", "sigma": 0.2}, {"policy_lr": 3e-4, "sigma": 0.2}),
    ],
)
def test_overrides_parse_strings_to_field_types(overrides, expected):
    config = D4PGConfig.from_overrides(overrides)
    for key, value in expected.items():
        assert getattr(config, key) == value
        assert type(getattr(config, key)) is type(value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"batch_sise": "128"}, "Unknown D4PG config key"),
        ({"batch_size": "many"}, "'batch_size': expected an integer, got 'many'"),
        ({"sigma": "wide"}, "'sigma': expected a number, got 'wide'"),
        ({"batch_size": "1.5"}, "expected an integer"),
        ({"clipping": "maybe"}, "expected a boolean"),
        ({"policy_layers": "64,x"}, "policy_layers"),
        ({"vmin": "200"}, "vmin"),
        ({"n_step": "0"}, "n_step must be >= 1"),
        ({"critic_lr_final_scale": "1.5"}, r"critic_lr_final_scale must be in \[0, 1\]"),
        ({"lr_decay_start_fraction": "1"}, r"lr_decay_start_fraction must be in \[0, 1\)"),
        ({"target_update_rate": "-0.1"}, r"target_update_rate must be in \[0, 1\]"),
        ({"noise_beta": "3"}, r"noise_beta must be in \[0, 2\]"),
        (
            {"normalize_observations": "true", "from_pixels": "true"},
            "normalize_observations standardises features",
        ),
    ],
)
def test_bad_overrides_say_what_is_wrong(overrides, message):
    with pytest.raises(ValueError, match=message):
        D4PGConfig.from_overrides(overrides)


def test_json_round_trip():
    config = D4PGConfig.from_overrides({"policy_layers": "64,64", "seed": "7", "sigma": "0.1"})
    text = config.to_json()
    assert json.loads(text)["policy_layers"] == [64, 64]
    assert D4PGConfig.from_json(text) == config
    assert D4PGConfig.from_dict(config.to_dict()) == config


def test_overrides_apply_on_top_of_a_base():
    base = D4PGConfig.from_overrides({"batch_size": 64})
    assert D4PGConfig.from_overrides({"sigma": "0.1"}, base=base).batch_size == 64


@pytest.mark.parametrize(
    "task, pixels, stack, repeat",
    [
        ("cartpole:swingup", True, 3, 8),
        ("finger:spin", True, 3, 2),
        ("walker:walk", True, 3, 2),
        ("cheetah:run", True, 3, 4),
        ("ball_in_cup:catch", True, 3, 4),
        ("cartpole:swingup", False, 1, 1),
    ],
)
def test_pixel_runs_default_to_frame_stack_3_and_the_domain_action_repeat(
    task, pixels, stack, repeat
):
    config = D4PGConfig(from_pixels=pixels)
    assert config.resolved_frame_stack() == stack
    assert config.resolved_action_repeat(task) == repeat
    explicit = D4PGConfig(from_pixels=pixels, action_repeat=5)
    assert explicit.resolved_action_repeat(task) == 5


def test_vmin_and_vmax_come_together_and_none_round_trips():
    with pytest.raises(ValueError, match="set both vmin and vmax"):
        D4PGConfig.from_overrides({"vmin": "-10"})
    config = D4PGConfig.from_overrides({"vmin": "none", "vmax": "None", "frame_stack": "none"})
    assert config.vmin is None and config.frame_stack is None
    assert D4PGConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="frame_stack > 1 needs from_pixels"):
        D4PGConfig.from_overrides({"frame_stack": "3"})


def test_acme_options_default_to_the_former_behaviour_and_parse():
    c = D4PGConfig()
    assert (c.act_with_target_policy, c.network_init, c.short_transitions_from_first_state) == (
        False,
        "lecun_uniform",
        False,
    )
    acme = D4PGConfig.from_overrides(
        {
            "act_with_target_policy": "true",
            "network_init": "acme",
            "short_transitions_from_first_state": "true",
        }
    )
    assert (acme.act_with_target_policy, acme.network_init) == (True, "acme")
    assert acme.short_transitions_from_first_state is True
    assert D4PGConfig.from_json(acme.to_json()) == acme


def test_bad_acme_option_values_say_what_is_valid():
    with pytest.raises(
        ValueError, match=r"network_init must be one of \['acme', 'lecun_uniform'\]"
    ):
        D4PGConfig.from_overrides({"network_init": "xavier"})
    with pytest.raises(ValueError, match="expected a boolean"):
        D4PGConfig.from_overrides({"act_with_target_policy": "target"})
    for name in ("act_with_target_policy", "short_transitions_from_first_state"):
        with pytest.raises(ValueError, match=f"{name} must be true or false"):
            D4PGConfig(**{name: "yes"})


def test_a_bad_critic_layer_norm_says_what_is_valid():
    with pytest.raises(
        ValueError, match=r"critic_layer_norm must be one of \['every', 'first'\], got 'all'"
    ):
        D4PGConfig.from_overrides({"critic_layer_norm": "all"})


def test_a_config_saved_before_the_acme_options_keeps_its_behaviour():
    saved = D4PGConfig(policy_layers=(8,)).to_dict()
    for key in SAVED_CONFIG_FALLBACKS:
        del saved[key]
    restored = D4PGConfig.from_saved(saved)
    assert restored.policy_layers == (8,)
    for key, value in SAVED_CONFIG_FALLBACKS.items():
        assert getattr(restored, key) == value
    # Keys the saved config has win over the fallbacks.
    assert D4PGConfig.from_saved({"network_init": "acme"}).network_init == "acme"


def test_a_negative_preactivation_penalty_is_refused_with_what_is_valid():
    with pytest.raises(ValueError, match=r"policy_preactivation_penalty must be >= 0 \(0: off\)"):
        D4PGConfig.from_overrides({"policy_preactivation_penalty": "-1e-3"})
    assert (
        D4PGConfig.from_overrides(
            {"policy_preactivation_penalty": "0"}
        ).policy_preactivation_penalty
        == 0
    )


def test_a_network_without_its_own_final_scale_follows_lr_final_scale():
    config = D4PGConfig.from_overrides({"lr_final_scale": "0.2", "policy_lr_final_scale": "1"})
    assert config.final_lr_scales() == (1.0, 0.2)
    assert D4PGConfig(lr_final_scale=0.3).final_lr_scales() == (0.3, 0.3)

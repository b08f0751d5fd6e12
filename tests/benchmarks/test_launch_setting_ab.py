"""Adding seeds to a stored A/B result: the stored runs stay, another setting is refused."""

import pytest

from benchmarks import launch_setting_ab as ab

pytestmark = pytest.mark.timeout(60)

FLAGS = ["--config.lr_decay_start_fraction=0.5"]


def _stored(seeds):
    runs = {str(s): {"seconds_to_target": 50.0 + s} for s in seeds}
    return {
        "candidate_flags": FLAGS,
        "target_return": 800.0,
        "runs": {"default": dict(runs), "candidate": dict(runs)},
    }


def test_new_seeds_join_the_stored_runs():
    new = {
        "default": {"4": {"seconds_to_target": 1.0}},
        "candidate": {"4": {"seconds_to_target": 2.0}},
    }
    merged = ab.merge_into_stored(_stored([0, 1]), new)
    assert sorted(merged["default"]) == ["0", "1", "4"]
    assert merged["candidate"]["0"] == {"seconds_to_target": 50.0}
    assert merged["candidate"]["4"] == {"seconds_to_target": 2.0}


@pytest.mark.parametrize(
    "flags, target",
    [(["--config.lr_decay_start_fraction=0.25"], 800.0), (FLAGS, 700.0)],
    ids=["other-flags", "other-target"],
)
def test_a_stored_result_of_another_setting_is_refused(flags, target):
    with pytest.raises(ValueError, match="give another --name"):
        ab.check_same_setting(_stored([0]), flags, target)
    ab.check_same_setting(_stored([0]), FLAGS, 800.0)  # The same setting is accepted.

"""The steps a run makes: ``training.max_steps`` capped by the data, and a line saying so."""

from pathlib import Path

from zbrl.config import load_config
from zbrl.launch.steps import epochs_for_steps, planned_steps, steps_notice

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


def cfg(*overrides: str):
    return load_config(DEMO, ["training.train_batch_size=8", *overrides])


def test_max_steps_within_the_data_is_kept_and_says_nothing():
    c = cfg("training.max_steps=300", "data.num_epochs=1")
    assert planned_steps(c, 4000) == 300
    assert steps_notice(c, 4000) is None
    assert steps_notice(cfg("training.max_steps=500", "data.num_epochs=1"), 4000) is None


def test_max_steps_beyond_the_data_is_capped_and_the_notice_names_the_fields_and_the_fix():
    c = cfg("training.max_steps=600", "data.num_epochs=1")
    assert planned_steps(c, 4000) == 500
    notice = steps_notice(c, 4000)
    assert notice is not None
    assert "training.max_steps=600" in notice and "= 500 steps" in notice
    assert "4000 prompts" in notice and "data.num_epochs=2 gives 600" in notice
    # with the epochs it names, the run makes the steps asked for
    assert planned_steps(cfg("training.max_steps=600", "data.num_epochs=2"), 4000) == 600


def test_without_max_steps_the_data_decides():
    c = cfg("training.max_steps=null", "data.num_epochs=3")
    assert planned_steps(c, 100) == 38  # ceil(3 epochs x 100 prompts / 8 per step)
    assert steps_notice(c, 100) is None


def test_epochs_for_steps_raises_the_epochs_only_where_needed():
    assert epochs_for_steps(cfg("data.num_epochs=1"), 4000, 600) == 2
    assert epochs_for_steps(cfg("data.num_epochs=1"), 4000, 500) == 1
    assert epochs_for_steps(cfg("data.num_epochs=3"), 4000, 600) == 3

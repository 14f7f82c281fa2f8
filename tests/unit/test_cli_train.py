"""``zbrl train``'s last line names the directory the run actually used."""

from zbrl import cli


def test_the_final_line_names_the_run_dir_used(tmp_path, monkeypatch, capsys):
    import zbrl.launch.driver as driver

    configured, used = tmp_path / "run", tmp_path / "run-20300102-120000"
    summary = {"steps": 3, "wall_s": 1.5, "run_dir": str(used)}
    monkeypatch.setattr(driver, "run_training", lambda cfg, **kw: summary)
    assert cli.main(["train", str(cli.DEMO_RECIPE), f"logging.run_dir={configured}"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"run finished: 3 steps in 1.5s -> {used}"

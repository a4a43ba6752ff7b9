"""The rollout's RMSE figure on files with many levels: CREDIT's configs hold 16 to 137 levels
a variable, hundreds of channels, each a panel; the figure draws three levels of each."""

from credit.rollout.plots import MAX_PANELS, plot_rmse_vs_lead, shown_channels


def _rows(levels: list[int], single: list[str]) -> list[dict[str, object]]:
    rows = []
    for lead in (1, 2):
        for variable in ("u", "v", "t", "q"):
            rows += [dict(lead_step=lead, lead_hours=6.0 * lead, variable=variable, level=float(level),
                          channel=f"{variable}_{level}", units="", rmse_model=1.0, rmse_persistence=2.0,
                          rmse_climatology="") for level in levels]
        rows += [dict(lead_step=lead, lead_hours=6.0 * lead, variable=name, level="", channel=name, units="K",
                      rmse_model=1.0, rmse_persistence=2.0, rmse_climatology=3.0) for name in single]
    return rows


def test_many_levels_are_drawn_at_three_levels_of_each_variable(tmp_path):
    levels = list(range(1, 19))  # CREDIT's example-v2026.2: 18 model levels
    single = ["SP", "t2m", "u10", "v10"] + [f"diag{i}" for i in range(8)]
    rows = _rows(levels, single)
    shown, note = shown_channels(rows)
    assert shown == [f"{v}_{lv}" for v in ("u", "v", "t", "q") for lv in (1, 10, 18)] + single
    assert "all 84 channels" in note
    path = tmp_path / "rmse_vs_lead.png"
    plot_rmse_vs_lead(rows, path)
    assert path.stat().st_size > 10_000


def test_every_channel_is_drawn_up_to_the_limit():
    rows = _rows([500, 850], ["SP", "t2m"])  # the embedded default's shape: 10 channels
    shown, note = shown_channels(rows)
    assert len(shown) == 10 and note == ""
    levels = list(range(1, (MAX_PANELS - 2) // 4 + 1))  # exactly at the limit
    shown, note = shown_channels(_rows(levels, ["SP", "t2m"]))
    assert len(shown) == 4 * len(levels) + 2 <= MAX_PANELS and note == ""

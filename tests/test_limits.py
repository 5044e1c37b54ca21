"""Limits: parsing sizes and times from text, validation, and one-line errors."""

from __future__ import annotations

import pytest

from cellbox.sandbox.limits import DEFAULT_CEILING, LimitError, Limits, format_size, parse_size, parse_time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256M", 256 * 1024**2),
        ("1.5G", int(1.5 * 1024**3)),
        ("64K", 65536),
        ("4096", 4096),
        ("2GiB", 2 * 1024**3),
        ("10kb", 10240),
        (" 3 M ", 3 * 1024**2),
    ],
)
def test_size_text_parses_to_bytes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5", 5.0), ("2.5s", 2.5), ("1m", 60.0), ("500ms", 0.5), ("1h", 3600.0), (".5", 0.5)],
)
def test_time_text_parses_to_seconds(text: str, expected: float) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "12X", "-5M", "1.2.3G", "M"])
def test_bad_size_is_a_one_line_error_naming_the_source(text: str) -> None:
    with pytest.raises(LimitError) as info:
        parse_size(text, source="--memory")
    message = str(info.value)
    assert message.startswith("--memory: ")
    assert "\n" not in message
    assert "256M" in message  # the message shows what a good value looks like


@pytest.mark.parametrize("text", ["0", "0s", "soon", "-1", "inf"])
def test_bad_or_zero_time_is_rejected(text: str) -> None:
    with pytest.raises(LimitError):
        parse_time(text)


def test_updated_accepts_aliases_and_keeps_other_fields() -> None:
    base = Limits(output=1000)
    limits = base.updated({"wall": "5", "cpu": "2", "memory": "256M", "output": "100K"})
    assert (limits.wall_time, limits.cpu_time, limits.memory, limits.output) == (5.0, 2.0, 256 * 1024**2, 102400)
    assert limits.file_size == base.file_size
    assert base.output == 1000  # frozen: the original is unchanged


def test_memory_can_be_switched_off() -> None:
    assert Limits().updated({"memory": "none"}).memory is None


def test_disk_and_resident_parse_as_sizes_or_none() -> None:
    limits = Limits().updated({"disk": "256M", "rss": "100M"}, source="%%limits line")
    assert (limits.disk, limits.resident) == (256 * 1024**2, 100 * 1024**2)
    assert limits.updated({"disk": "none", "resident": "unlimited"}).disk is None
    with pytest.raises(LimitError, match=r"^%%limits line \(disk\): 'lots' is not a size"):
        Limits().updated({"disk": "lots"}, source="%%limits line")


def test_unknown_limit_name_lists_the_known_ones() -> None:
    with pytest.raises(LimitError) as info:
        Limits().updated({"walltime": "5"}, source="%%limits line")
    assert str(info.value).startswith("%%limits line: unknown limit 'walltime'")
    assert "wall_time" in str(info.value)


@pytest.mark.parametrize(
    "changes",
    [{"nice": 20}, {"nice": -1}, {"io_class": "realtime"}, {"open_files": 0}, {"wall_time": 0}, {"memory": -5}],
)
def test_out_of_range_fields_are_rejected(changes: dict[str, object]) -> None:
    with pytest.raises(LimitError):
        Limits(**changes)  # type: ignore[arg-type]


def test_defaults_are_the_documented_ones() -> None:
    limits = Limits()
    assert limits.as_dict() == {
        "wall_time": 30.0,
        "cpu_time": 30.0,
        "memory": 2 * 1024**3,
        "output": 1024**2,
        "file_size": 512 * 1024**2,
        "shared_memory": 512 * 1024**2,
        "open_files": 256,
        "processes": 128,
        "disk": None,
        "resident": None,
        "nice": 19,
        "io_class": "idle",
    }


def test_format_size_round_trips_common_values() -> None:
    for text in ("256M", "2G", "64K", "1.5G"):
        assert parse_size(format_size(parse_size(text))) == parse_size(text)
    assert format_size(parse_size("256M")) == "256M"


# --------------------------------------------------------------------------- the ceiling


def test_capped_lowers_what_asks_for_more_and_names_it() -> None:
    ceiling = Limits(wall_time=60, memory=1024**3, processes=40, nice=10, io_class="best-effort")
    asked = Limits(wall_time=99999, memory=None, processes=100000, nice=0, io_class="none", open_files=10)
    capped, over = asked.capped(ceiling)
    assert over == ["wall_time", "memory", "processes", "nice", "io_class"]
    assert (capped.wall_time, capped.memory, capped.processes, capped.nice, capped.io_class) == (
        60.0,
        1024**3,
        40,
        10,
        "best-effort",
    )
    assert capped.open_files == 10  # lower than the ceiling: kept


def test_capped_keeps_limits_under_the_ceiling_unchanged() -> None:
    low = Limits(wall_time=5, memory=256 * 1024**2, nice=19, io_class="idle")
    assert low.capped(DEFAULT_CEILING) == (low, [])


def test_a_ceiling_without_a_memory_cap_lets_none_through() -> None:
    assert Limits(memory=None).capped(Limits(memory=None)) == (Limits(memory=None), [])


def test_widened_raises_the_ceiling_to_the_sessions_own_limits() -> None:
    ceiling = DEFAULT_CEILING.widened(Limits(memory=None, processes=1000))
    assert (ceiling.memory, ceiling.processes, ceiling.wall_time) == (None, 1000, DEFAULT_CEILING.wall_time)


def test_memory_bound_counts_both_tmpfs_beside_the_address_space() -> None:
    assert Limits(memory=256 * 1024**2).memory_bound() == 256 * 1024**2 + 2 * Limits().shared_memory
    assert Limits(memory=256 * 1024**2, resident=100 * 1024**2).memory_bound() == 100 * 1024**2
    assert Limits(memory=None).memory_bound() is None


def test_shared_memory_parses_as_a_size_with_its_short_name() -> None:
    assert Limits().updated({"shm": "1G"}).shared_memory == 1024**3

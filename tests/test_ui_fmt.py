"""The UI's number formatting: missing values are never drawn as zero, text from processes is
made safe to print, sparklines say "no sample" with a blank."""

from __future__ import annotations

from rich.text import Text

from gputop.ui import fmt


def test_missing_values_are_na_never_zero():
    for f in (fmt.pct, fmt.size, fmt.rate_bytes, fmt.rate_mib, fmt.duration):
        assert f(None) == "n/a"
    assert fmt.num(None, "W") == "n/a"
    assert fmt.size_pair(None, 100) == "n/a"
    assert fmt.pct(float("nan")) == "n/a"
    assert fmt.pct(0) == "0%"  # a real zero stays a zero


def test_units():
    assert fmt.size(512) == "512B"
    assert fmt.size(3 * 1024 ** 3 + 1024 ** 3 // 10) == "3.1G"
    assert fmt.size_pair(70 * 1024 ** 3, 141 * 1024 ** 3) == "70.0/141G"
    assert fmt.rate_mib(5.0) == "5.0 MiB/s" and fmt.rate_mib(6000) == "5.9 GiB/s"
    assert fmt.duration(42) == "0:42" and fmt.duration(3723) == "1:02:03"


def test_control_characters_from_a_process_are_not_sent_to_the_terminal():
    evil = "python\x1b]0;pwned\x07 -c 'x'\nrm"
    out = fmt.clip(evil, 80)
    assert "\x1b" not in out and "\x07" not in out and "\n" not in out
    assert out.startswith("python?]0;pwned? -c 'x'⏎rm")


def test_sparkline_blank_means_no_sample_and_values_hold_briefly():
    points = [(0.5, 10), (1.5, 50), (5.0, 100)]
    # 10 cells of 1 s ending at t=10: cells 1..10; the 0.5 s sample is before the window
    assert fmt.spark(points, 10, 10, 10, 0, 100) == "▅▅▅▅███   "
    assert fmt.spark(points, 10, 10, 10, 0, 100, hold_s=0) == "▅   █     "
    # None, NaN and booleans are not values: blanks, not low bars
    assert fmt.spark([(1.5, None), (2.5, float("nan")), (3.5, True), (4.5, float("inf"))], 10, 10, 10, 0, 100) == " " * 10
    # a real zero is the lowest bar, not a blank (held into the last cell, which holds t_end)
    assert fmt.spark([(9.5, 0)], 10, 10, 10, 0, 100) == " " * 8 + "▁▁"


def test_cell_means_one_pass_for_several_fields():
    class S:
        def __init__(self, t, **data):
            self.t, self.data = t, data
    samples = [S(8.2, a=10, b=None), S(8.7, a=30, b=4), S(9.5, a=None, b=8)]
    cells = fmt.cell_means(samples, ("a", "b"), 10, 4, 4, hold_s=0)
    # cells cover [7,8) [8,9) [9,10) [10,11)
    assert cells["a"] == [None, 20.0, None, None]
    assert cells["b"] == [None, 4.0, 8.0, None]


def test_gpm_fields_hold_until_the_next_gpm_snapshot_in_a_sparkline():
    """GPM values come every 0.5 s, every ~2 s while the job is calm (up to ~3.6 s apart): the
    GPU view's sparklines hold them GPM_HOLD_S (the fields' own hold), not the 2.5 s of the
    fields every sample carries, so a calm GPM line has no blank cells between snapshots."""
    from gputop.sources.nvml_fields import GPM_HOLD_S
    from gputop.ui.snapshot import _LONGER

    class S:
        def __init__(self, t, **data):
            self.t, self.data = t, data
    # util every 0.4 s, SM active twice, 3.5 s apart
    samples = [S(round(0.4 * k, 1), util_gpu=50, sm_active=(60 if k in (1, 10) else None)) for k in range(20)]
    cells = fmt.cell_means(samples, ("util_gpu", "sm_active"), 8.0, 8, 8, longer=_LONGER)
    assert None not in cells["sm_active"][:8] and None not in cells["util_gpu"]
    assert 3.5 < GPM_HOLD_S
    short = fmt.cell_means(samples, ("util_gpu", "sm_active"), 8.0, 8, 8)
    assert None in short["sm_active"][:5]   # the 2.5 s hold alone leaves a gap there


def test_fit_marks_a_cut_with_an_ellipsis_and_keeps_styles():
    t = Text("anomaly detection off · deterministic off")
    t.stylize("bold", 0, 7)
    got = fmt.fit(t, 26)
    assert got.plain == "anomaly detection off · d…" and got.cell_len == 26
    assert got.spans and got.spans[0].style == "bold"
    assert t.plain.endswith("deterministic off")  # a copy: the original is not cut
    assert fmt.fit(Text("short"), 26).plain == "short"


def test_wrap_breaks_between_words_indents_and_marks_what_it_cuts():
    advice = ("More threads want to run than there are cores: use fewer DataLoader workers "
              "(now 2 on 2 cores), limit torch's CPU threads (torch.set_num_threads)")
    lines = [x.plain for x in fmt.wrap(advice, 50, max_lines=2, indent=4)]
    assert len(lines) == 2 and all(len(x) <= 50 for x in lines)
    assert lines[1].startswith("    ") and lines[1].endswith("…")
    assert advice.startswith(" ".join(x.strip() for x in lines)[:-1].rstrip())
    assert not lines[0].endswith(" ") and advice[len(lines[0])] == " "  # a break between words
    # enough lines: all of it, nothing cut
    whole = [x.plain for x in fmt.wrap(advice, 50, max_lines=5, indent=4)]
    assert " ".join(x.strip() for x in whole) == advice and not whole[-1].endswith("…")
    # a separator is preferred where it falls in the line
    parts = [x.plain for x in fmt.wrap("torch.compile not used · CUDA_LAUNCH_BLOCKING unset · "
                                       "anomaly detection off", 60, 3, indent=2, sep=" · ")]
    assert parts == ["torch.compile not used · CUDA_LAUNCH_BLOCKING unset", "  anomaly detection off"]
    assert [x.plain for x in fmt.wrap("fits", 10)] == ["fits"]
    # control characters from a process are made visible, never sent
    assert "\x1b" not in fmt.wrap("a\x1b[31mb", 10)[0].plain

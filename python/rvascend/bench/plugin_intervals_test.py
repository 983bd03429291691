"""Reading the counting plugin's intervals, and the image count's marked regions from them."""

from __future__ import annotations

from rvascend.bench import image_instruction_count
from rvascend.bench.plugin_intervals import read, read_intervals

# Start-up, then markers 0..3: regions (0, 1) and (2, 3); interval 2 (a gap) is empty.
OUTPUT = """I 0
10 500 0
T 0 500 0
I 1
7a 30 12
7b 5 0
T 0 20 12
T 1 15 0
K memory 4
K reduction 8
I 2
I 3
7a 70 40
T 1 70 40
K multiply 40
I 4
10 9 0
T 0 9 0
"""


def test_intervals_by_page(tmp_path):
    path = tmp_path / "counts.txt"
    path.write_text(OUTPUT)
    intervals = read_intervals(str(path))
    assert intervals == {0: {0x10: (500, 0)}, 1: {0x7a: (30, 12), 0x7b: (5, 0)}, 2: {}, 3: {0x7a: (70, 40)},
                         4: {0x10: (9, 0)}}


def test_marked_regions_are_the_odd_intervals(tmp_path):
    path = tmp_path / "counts.txt"
    path.write_text(OUTPUT)
    assert image_instruction_count.marked_counts(str(path)) == [35, 70]


def test_threads_and_totals(tmp_path):
    path = tmp_path / "counts.txt"
    path.write_text(OUTPUT)
    threads = read(str(path)).threads
    assert threads[1] == {0: (20, 12), 1: (15, 0)}
    assert threads[2] == {} and threads[3] == {1: (70, 40)}
    assert read(str(path)).totals() == [(500, 0), (35, 12), (0, 0), (70, 40), (9, 0)]


def test_vector_kinds(tmp_path):
    path = tmp_path / "counts.txt"
    path.write_text(OUTPUT)
    kinds = read(str(path)).kinds
    assert kinds == {0: {}, 1: {"memory": 4, "reduction": 8}, 2: {}, 3: {"multiply": 40}, 4: {}}

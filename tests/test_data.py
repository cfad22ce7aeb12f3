"""Tests of pnn_fast.data: parsers, filtering, RecBole's split, real data, synthetic data."""
from __future__ import annotations

import pickle
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from pnn_fast.data import (
    DataFormatError,
    Dataset,
    default_data_dir,
    load_dataset,
    random_share_by_user,
    random_split_by_user,
    split_counts,
    synthetic_dataset,
)
from pnn_fast.data.parsers import read_atomic_inter, read_csv, read_lightgcn, read_movielens_dat

DATA = default_data_dir()


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def original_pairs(ds: Dataset, split: str) -> set:
    """A split's interactions as (original user id, original item id) pairs."""
    users, items = getattr(ds, split)
    return {(ds.user_ids[u], ds.item_ids[i]) for u, i in zip(users.tolist(), items.tolist())}


def all_pairs(ds: Dataset) -> list:
    return [pair for split in ("train", "valid", "test") for pair in original_pairs(ds, split)]


def check_well_formed(ds: Dataset) -> None:
    """int64 0-based ids in range, each split sorted by (user, item), no pair twice anywhere."""
    keys = []
    for users, items in (ds.train, ds.valid, ds.test):
        assert users.dtype == items.dtype == torch.int64 and users.shape == items.shape and users.dim() == 1
        if users.numel():
            assert 0 <= users.min() and users.max() < ds.num_users
            assert 0 <= items.min() and items.max() < ds.num_items
        key = users * ds.num_items + items
        assert torch.equal(key, key.sort().values)
        keys.append(key)
    every = torch.cat(keys)
    assert every.unique().numel() == every.numel()


# --------------------------------------------------------------------------- formats


def test_lightgcn_folder_keeps_files_split_and_remaps_sorted(tmp_path):
    write(tmp_path, "train.txt", "10 7 3\n5 100 3\n\n20\n")  # user 20 has no items
    write(tmp_path, "valid.txt", "10 100\n")
    write(tmp_path, "test.txt", "5 7\n10 8\n")
    ds = load_dataset(tmp_path)
    check_well_formed(ds)
    assert ds.name == tmp_path.name
    assert ds.user_ids == [5, 10] and ds.item_ids == [3, 7, 8, 100]
    assert (ds.num_users, ds.num_items) == (2, 4)
    assert original_pairs(ds, "train") == {(10, 7), (10, 3), (5, 100), (5, 3)}
    assert original_pairs(ds, "valid") == {(10, 100)}
    assert original_pairs(ds, "test") == {(5, 7), (10, 8)}
    # Sorted remap: user 5 -> 0, item 3 -> 0, so train is [(0,0), (0,3), (1,0), (1,1)].
    assert ds.train[0].tolist() == [0, 0, 1, 1] and ds.train[1].tolist() == [0, 3, 0, 1]


def test_lightgcn_pair_in_two_files_stays_in_the_earliest(tmp_path):
    write(tmp_path, "train.txt", "0 1 2 1\n")  # duplicate inside a file too
    write(tmp_path, "valid.txt", "0 2 3\n")
    write(tmp_path, "test.txt", "0 1 3 4\n")
    ds = load_dataset(tmp_path)
    assert original_pairs(ds, "train") == {(0, 1), (0, 2)}
    assert original_pairs(ds, "valid") == {(0, 3)}
    assert original_pairs(ds, "test") == {(0, 4)}
    # 8 interactions, 4 pairs: (0, 1) twice in train and once in test, (0, 2) and (0, 3) twice each
    assert ds.duplicates == 4 and ds.summary().endswith("; 4 duplicate (user, item) pairs dropped")


def test_duplicates_are_counted_after_the_rating_threshold(tmp_path):
    path = write(tmp_path, "r.csv", "user,item,rating\n1,2,5\n1,2,4\n1,3,1\n1,3,1\n2,2,5\n1,2,5\n")
    assert load_dataset(path, split="rs", ratios=(1, 0, 0)).duplicates == 3
    kept = load_dataset(path, split="rs", ratios=(1, 0, 0), rating_threshold=4)
    assert kept.duplicates == 2 and "2 duplicate (user, item) pairs dropped" in kept.summary()
    assert sorted(all_pairs(kept)) == [(1, 2), (2, 2)]


def test_lightgcn_without_valid_carves_valid_out_of_train(tmp_path):
    sizes = {user: n for user, n in enumerate([1, 2, 9, 10, 18, 30])}
    write(tmp_path, "train.txt", "".join(f"{u} " + " ".join(str(i) for i in range(n)) + "\n" for u, n in sizes.items()))
    write(tmp_path, "test.txt", "".join(f"{u} {100 + u}\n" for u in sizes))
    ds = load_dataset(tmp_path)  # auto -> files
    check_well_formed(ds)
    assert original_pairs(ds, "test") == {(u, 100 + u) for u in sizes}
    train_file = {(u, i) for u, n in sizes.items() for i in range(n)}
    assert original_pairs(ds, "train") | original_pairs(ds, "valid") == train_file
    # RecBole's rounding with ratios 0.8 : 0.1, i.e. 8/9 : 1/9 of each user's train file.
    valid_per_user = torch.bincount(ds.valid[0], minlength=ds.num_users).tolist()
    assert valid_per_user == [0, 1, 1, 1, 2, 3]


def test_single_lightgcn_file_is_split_randomly(tmp_path):
    path = write(tmp_path, "all.txt", "".join(f"{u} " + " ".join(map(str, range(20))) + "\n" for u in range(5)))
    ds = load_dataset(path)
    assert ds.name == "all"
    assert [t[0].numel() for t in (ds.train, ds.valid, ds.test)] == [80, 10, 10]
    with pytest.raises(ValueError, match="split='files'"):
        load_dataset(path, split="files")


def test_atomic_inter_columns_found_by_name(tmp_path):
    write(tmp_path, "toy.inter",
          "timestamp:float\titem_id:token\textra:token_seq\tuser_id:token\trating:float\n"
          "3\ti9\ta b\tu2\t5\n"
          "1\ti1\t\tu1\t3.5\n"
          "\n"
          "2\ti1\tz\tu2\t1\n"
          "4\ti1\tz\tu2\t2\n")  # duplicate pair (u2, i1)
    ds = load_dataset(tmp_path, split="rs", ratios=(1, 0, 0))
    assert ds.name == tmp_path.name
    assert ds.user_ids == ["u1", "u2"] and ds.item_ids == ["i1", "i9"]
    assert sorted(all_pairs(ds)) == [("u1", "i1"), ("u2", "i1"), ("u2", "i9")]
    kept = load_dataset(tmp_path / "toy.inter", rating_threshold=3.5, split="rs", ratios=(1, 0, 0))
    assert kept.name == "toy"
    assert sorted(all_pairs(kept)) == [("u1", "i1"), ("u2", "i9")]  # >= keeps 3.5


def test_movielens_dat_and_csv(tmp_path):
    dat = write(tmp_path, "ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n2::1193::4::978298413\n")
    ds = load_dataset(tmp_path, split="rs", ratios=(1, 0, 0))
    assert ds.name == tmp_path.name
    assert ds.user_ids == [1, 2] and ds.item_ids == [661, 1193]  # numeric, not string, order
    assert ds.train[0].numel() == 3
    assert sorted(all_pairs(load_dataset(dat, rating_threshold=4, ratios=(1, 0, 0)))) == [(1, 1193), (2, 1193)]

    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    write(csv_dir, "ratings.csv",
          "userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n1,1029,3.0,1260759179\n7,31,4.0,1\n")
    ds = load_dataset(csv_dir, format="movielens", rating_threshold=3, ratios=(1, 0, 0))
    assert sorted(all_pairs(ds)) == [(1, 1029), (7, 31)]


def test_generic_csv_with_and_without_header(tmp_path):
    no_header = write(tmp_path, "a.csv", "bob,apple\nalice,pear\nbob,pear\n")
    ds = load_dataset(no_header, ratios=(1, 0, 0))
    assert ds.user_ids == ["alice", "bob"] and ds.item_ids == ["apple", "pear"]
    assert sorted(all_pairs(ds)) == [("alice", "pear"), ("bob", "apple"), ("bob", "pear")]

    header = write(tmp_path, "b.csv", "user_id,score,item_id,rating\n1,x,10,1\n2,y,10,5\n2,y,007,5\n")
    ds = load_dataset(header, rating_threshold=2, ratios=(1, 0, 0))
    # "007" is not a canonical integer, so item ids stay strings.
    assert ds.item_ids == ["007", "10"] and ds.user_ids == [2]

    with pytest.raises(ValueError, match="no rating column"):
        load_dataset(write(tmp_path, "c.csv", "1,2\n"), rating_threshold=1)


@pytest.mark.parametrize("header, rows", [
    ("item,user", "10,1\n11,1\n10,2\n"),  # columns by name, in any order (it was read positionally, swapped)
    ('"user","item"', '1,10\n1,11\n2,10\n'),  # quoted names (the header became an interaction)
    ("User ID,Item ID", "1,10\n1,11\n2,10\n"),  # spaces and capitals
])
def test_a_csv_header_is_found_by_its_names(tmp_path, header, rows):
    """Issue 67's hunt: these headers were read as an interaction ('item' a user, 'user' an item)."""
    if header == "item,user":
        rows = "".join(f"{i},{u}\n" for u, i in ((1, 10), (1, 11), (2, 10)))
    ds = load_dataset(write(tmp_path, "h.csv", f"{header}\n{rows}"), ratios=(1, 0, 0))
    assert ds.user_ids == [1, 2] and ds.item_ids == [10, 11]
    assert sorted(all_pairs(ds)) == [(1, 10), (1, 11), (2, 10)]


def test_a_data_file_suffix_in_capitals_is_known(tmp_path):
    assert load_dataset(write(tmp_path, "R.CSV", "1,2\n2,3\n"), ratios=(1, 0, 0)).num_users == 2


def test_format_detection_and_arguments(tmp_path):
    write(tmp_path, "x.inter", "user_id:token\titem_id:token\n1\t2\n")
    write(tmp_path, "ratings.csv", "userId,movieId\n1,2\n")
    assert load_dataset(tmp_path).name == tmp_path.name  # .inter wins over ratings.csv
    assert load_dataset(tmp_path, format="movielens").num_users == 1
    write(tmp_path, "y.inter", "user_id:token\titem_id:token\n1\t2\n")
    with pytest.raises(ValueError, match="several inter files"):
        load_dataset(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path, format="lightgcn")
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path / "missing")
    with pytest.raises(ValueError, match="split='files'"):
        load_dataset(tmp_path / "x.inter", split="files")
    for bad in ({"format": "json"}, {"split": "loo"}, {"ratios": (0.8, 0.2)}, {"ratios": (1, -1, 1)}, {"kcore": -1}):
        with pytest.raises(ValueError):
            load_dataset(tmp_path / "x.inter", **bad)


def test_lightgcn_has_no_ratings(tmp_path):
    write(tmp_path, "train.txt", "0 1\n")
    write(tmp_path, "test.txt", "0 2\n")
    with pytest.raises(ValueError, match="no rating column"):
        load_dataset(tmp_path, rating_threshold=1)


MALFORMED = [
    ("train.txt", "0 1 2\n1 2 x\n", 2, "'x' is not a non-negative integer"),
    ("train.txt", "0 1\n\n-3 2\n", 3, "user id -3 is negative"),
    ("train.txt", "0 1 -2\n", 1, "item id -2 is negative"),
    ("train.txt", "0 1 2.0\n", 1, "not a non-negative integer"),
    ("train.txt", "0 1 1234567890123456789\n", 1, "too large"),
    ("d.inter", "user_id:token\titem_id:token\trating:float\n1\t2\t3\n1\t2\n", 3, "expected 3 fields"),
    ("d.inter", "user_id:token\titem_id:token\trating:float\n1\t2\t3\n\n1\t3\tgood\n", 4,
     "rating 'good' is not a number"),
    ("d.inter", "user_id:token\titem_id:token\trating:float\n1\t2\tnan\n", 2, "not finite"),
    ("d.inter", "user_id:token\trating:float\n1\t2\n", 1, "no item_id column"),
    ("d.inter", "user_id\titem_id\n1\t2\n", 1, "not of the form name:type"),
    ("d.inter", "\nuser_id:token\titem_id:token\n", 1, "missing header"),
    ("ratings.dat", "1::2::3::4\n1::2::3\n", 2, "expected 4 fields"),
    ("ratings.dat", "1::2::3::4\n1::2::3::later\n", 2, "timestamp 'later' is not a number"),
    ("ratings.dat", "1::2::3::4\n\nu7::2::3::4\n", 3, "user id 'u7' is not a non-negative integer"),
    ("ratings.dat", "1::2::3::4\n1::-2::3::4\n", 2, "item id '-2' is not a non-negative integer"),
    ("e.csv", "1,2\n3,4\n5\n", 3, "expected 2 fields"),
    ("e.csv", "1,2,3,4,5\n", 1, "expected user,item"),
    ("e.csv", "user,item,rating\n1,2,3\n3,,4\n", 3, "empty item id"),
    ("e.csv", "user,rating\n1,2\n", 1, "no item column"),
    # found by tests/fuzz/fuzz_parsers.py: numpy's str arrays drop trailing NULs, so these ids were
    # read as "", "c" (merged with a real "c") and "2" (which then passed the integer test)
    ("d.inter", "user_id:token\titem_id:token\n1\t2\n\0\t3\n", 3, "user id '\\x00' contains a NUL character"),
    ("e.csv", "c,d\nc\0,d\n", 2, "user id 'c\\x00' contains a NUL character"),
    ("ratings.dat", "1::2\0::3::4\n", 1, "item id '2\\x00' contains a NUL character"),
    # also found by the fuzzer: Python's float() takes digit-group underscores and non-ASCII digits
    ("ratings.dat", "1::2::3::4\n1::3::4::1_0\n", 2, "timestamp '1_0' is not a number"),
    ("e.csv", "user,item,rating\n1,2,3\n1,3,\u0664\n", 3, "rating '\u0664' is not a number"),
    ("d.inter", "user_id:token\titem_id:token\trating:float\n1\t2\t\u20073\n", 2, "is not a number"),
]


@pytest.mark.parametrize("name, text, line, problem", MALFORMED)
def test_malformed_line_names_file_and_line(tmp_path, name, text, line, problem):
    path = write(tmp_path, name, text)
    with pytest.raises(DataFormatError) as info:
        load_dataset(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: ")
    assert problem in message
    assert (info.value.path, info.value.line) == (str(path), line)


@pytest.mark.parametrize("name, reader", [("train.txt", read_lightgcn), ("d.inter", read_atomic_inter),
                                          ("ratings.dat", read_movielens_dat), ("e.csv", read_csv)])
def test_a_file_without_interactions_is_empty_not_a_crash(tmp_path, name, reader):
    """Found by tests/fuzz/fuzz_parsers.py: an empty ratings.dat raised StopIteration. Blank files
    (and a header alone) read as no interactions, which load_dataset then rejects by name."""
    header = "user_id:token\titem_id:token\n" if name.endswith(".inter") else ""
    for text in (header, header + "\n \r\n"):
        path = write(tmp_path, name, text)
        assert reader(path).users.size == 0
        with pytest.raises(ValueError, match=f"no interactions left in {re.escape(str(path))}"):
            load_dataset(path)


@pytest.mark.parametrize("name, text", [
    ("e.csv", "userId,movieId,rating\n1,2,4.5\n3,2,1\n"),
    ("d.inter", "user_id:token\titem_id:token\trating:float\n1\t2\t4.5\n3\t2\t1\n"),
    ("ratings.dat", "1::2::4.5::0\n3::2::1::0\n"),
])
def test_a_byte_order_mark_is_not_data(tmp_path, name, text):
    """Found by tests/fuzz/fuzz_parsers.py: a UTF-8 BOM (as spreadsheet exports write) before a CSV
    header made it a data row. With or without one, a file reads the same."""
    for folder in ("plain", "marked"):
        (tmp_path / folder).mkdir()
    plain = load_dataset(write(tmp_path / "plain", name, text), rating_threshold=0)
    marked_path = tmp_path / "marked" / name
    marked_path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    marked = load_dataset(marked_path, rating_threshold=0)
    assert (marked.num_users, marked.num_items) == (plain.num_users, plain.num_items) == (2, 1)
    assert list(map(str, marked.user_ids)) == list(map(str, plain.user_ids)) == ["1", "3"]


def test_malformed_split_file_is_reported_from_a_folder(tmp_path):
    write(tmp_path, "train.txt", "0 1\n")
    write(tmp_path, "test.txt", "0 2\n1 q\n")
    with pytest.raises(DataFormatError, match=r"test\.txt:2: item id 'q'"):
        load_dataset(tmp_path)


def test_data_format_error_is_a_value_error_and_pickles():
    err = DataFormatError("f.txt", 7, "bad")
    assert isinstance(err, ValueError) and str(err) == "f.txt:7: bad"
    again = pickle.loads(pickle.dumps(err))
    assert (str(again), again.path, again.line, again.problem) == ("f.txt:7: bad", "f.txt", 7, "bad")


# --------------------------------------------------------------------------- filtering


def test_kcore_iterates_until_stable(tmp_path):
    # k = 2.  Item 3 has one interaction -> (c, 3) goes -> user c is left with one
    # -> (c, 2) goes -> item 2 still has a and b.  A single pass would keep (c, 2).
    # User d has items 4, 5 that nobody else has: both go, then d has none.
    path = write(tmp_path, "k.csv", "a,1\na,2\nb,1\nb,2\nc,2\nc,3\nd,4\nd,5\n")
    ds = load_dataset(path, kcore=2, ratios=(1, 0, 0))
    assert ds.user_ids == ["a", "b"] and ds.item_ids == [1, 2]
    assert sorted(all_pairs(ds)) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert load_dataset(path, kcore=1, ratios=(1, 0, 0)).train[0].numel() == 8
    with pytest.raises(ValueError, match="no interactions left"):
        load_dataset(path, kcore=3)


def test_kcore_runs_after_the_rating_threshold(tmp_path):
    # Without the threshold user a has 2 interactions; with it, 1.
    path = write(tmp_path, "r.csv", "a,1,5\na,2,1\nb,1,5\nb,2,5\nc,1,5\nc,2,5\n")
    assert load_dataset(path, kcore=2, ratios=(1, 0, 0)).num_users == 3
    ds = load_dataset(path, kcore=2, rating_threshold=3, ratios=(1, 0, 0))
    assert ds.user_ids == ["b", "c"] and ds.num_items == 2


# --------------------------------------------------------------------------- RecBole split

# RecBole's Dataset._calcu_split_ids for ratios [0.8, 0.1, 0.1], computed by hand:
# valid = int(0.1 n), test = int(0.1 n), train = n - valid - test; then, for test
# and then valid, while train > 1: a part with 0 < 0.1 n < 1 takes one from train.
RECBOLE_8_1_1 = {
    0: (0, 0, 0),
    1: (1, 0, 0),   # train = 1 already: the loop stops at once
    2: (1, 0, 1),   # test bumped to 1, train down to 1, loop stops before valid
    3: (1, 1, 1),
    4: (2, 1, 1),
    5: (3, 1, 1),
    6: (4, 1, 1),
    7: (5, 1, 1),
    8: (6, 1, 1),
    9: (7, 1, 1),
    10: (8, 1, 1),  # 0.1 * 10 = 1 is not < 1: no bump
    11: (9, 1, 1),
    12: (10, 1, 1),
    19: (17, 1, 1),
    20: (16, 2, 2),
}


def test_split_counts_match_recbole_table():
    sizes = torch.tensor(sorted(RECBOLE_8_1_1))
    got = split_counts(sizes, (0.8, 0.1, 0.1))
    assert got.dtype == torch.int64
    assert {n: tuple(row) for n, row in zip(sizes.tolist(), got.tolist())} == RECBOLE_8_1_1
    # Ratios need not be normalised.
    assert torch.equal(split_counts(sizes, (8, 1, 1)), got)
    # Two parts, 8:1 (the valid carve-out): n=1 -> (1, 0), n=2 -> (1, 1), n=18 -> (16, 2).
    two = split_counts(torch.tensor([1, 2, 9, 10, 18]), (0.8, 0.1)).tolist()
    assert two == [[1, 0], [1, 1], [8, 1], [9, 1], [16, 2]]


def test_random_split_per_user_counts_follow_the_table():
    sizes = list(range(1, 13)) + [19, 20]
    users = torch.cat([torch.full((n,), u) for u, n in enumerate(sizes)])
    part = random_split_by_user(users, len(sizes), (0.8, 0.1, 0.1), seed=2020)
    assert part.dtype == torch.int64 and part.shape == users.shape
    for u, n in enumerate(sizes):
        got = torch.bincount(part[users == u], minlength=3).tolist()
        assert tuple(got) == RECBOLE_8_1_1[n], n


def _toy_users(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 40, (300,), generator=gen)
    users = torch.arange(300).repeat_interleave(sizes)
    return users[torch.randperm(users.numel(), generator=gen)]  # interleaved users


def test_random_split_is_a_seeded_partition():
    users = _toy_users()
    part = random_split_by_user(users, 300, (0.8, 0.1, 0.1), seed=1)
    sizes = torch.bincount(users, minlength=300)
    per_user = torch.stack([torch.bincount(users[part == p], minlength=300) for p in range(3)], 1)
    assert torch.equal(per_user, split_counts(sizes, (0.8, 0.1, 0.1)))  # every interaction in one part
    assert torch.equal(random_split_by_user(users, 300, (0.8, 0.1, 0.1), seed=1), part)
    assert not torch.equal(random_split_by_user(users, 300, (0.8, 0.1, 0.1), seed=2), part)


def test_random_split_is_uniform_within_a_user():
    # One user with 10 interactions: each lands in test (1 of 10) with probability 0.1.
    users = torch.zeros(10, dtype=torch.int64)
    hits = torch.zeros(10)
    for seed in range(2000):
        hits += (random_split_by_user(users, 1, (0.8, 0.1, 0.1), seed) == 2).float()
    assert torch.all((hits / 2000 - 0.1).abs() < 0.03)


def test_rs_split_through_load_dataset(tmp_path):
    users = _toy_users().tolist()
    lines = [f"{u},{(u * 7 + k) % 97}" for k, u in enumerate(users)]
    path = write(tmp_path, "toy.csv", "\n".join(lines) + "\n")
    ds = load_dataset(path, seed=5)
    check_well_formed(ds)
    expected = {(int(u), int(i)) for u, i in (line.split(",") for line in lines)}
    pairs = all_pairs(ds)
    assert len(pairs) == len(expected) and set(pairs) == expected  # nothing lost, nothing twice
    per_user = torch.bincount(torch.cat([ds.train[0], ds.valid[0], ds.test[0]]), minlength=ds.num_users)
    counts = torch.stack([torch.bincount(s[0], minlength=ds.num_users) for s in (ds.train, ds.valid, ds.test)], 1)
    assert torch.equal(counts, split_counts(per_user, (0.8, 0.1, 0.1)))

    # The split depends on the data and the seed, not on the order of the lines.
    shuffled = write(tmp_path, "shuffled.csv", "\n".join(reversed(lines)) + "\n")
    again = load_dataset(shuffled, seed=5)
    for a, b in zip((ds.train, ds.valid, ds.test), (again.train, again.valid, again.test)):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    other = load_dataset(path, seed=6)
    assert not torch.equal(other.test[1], ds.test[1])


def test_hide_train_share_moves_a_share_of_each_users_training_pairs_out(tmp_path):
    users = _toy_users().tolist()
    lines = [f"{u},{(u * 7 + k) % 97}" for k, u in enumerate(users)]
    path = write(tmp_path, "toy.csv", "\n".join(lines) + "\n")
    clean = load_dataset(path, seed=5)
    hidden = load_dataset(path, seed=5, hide_train_share=0.25)
    check_well_formed(hidden)
    # valid and test as they were; train = clean train minus the hidden pairs, which no split has
    for split in ("valid", "test"):
        assert original_pairs(hidden, split) == original_pairs(clean, split)
    moved = {(hidden.user_ids[u], hidden.item_ids[i]) for u, i in zip(*(t.tolist() for t in hidden.hidden))}
    assert moved and original_pairs(hidden, "train") | moved == original_pairs(clean, "train")
    assert not original_pairs(hidden, "train") & moved
    # floor(share * n) per user, so a user with fewer than 4 training pairs keeps them all
    train_sizes = torch.bincount(clean.train[0], minlength=clean.num_users)
    assert torch.equal(torch.bincount(hidden.hidden[0], minlength=clean.num_users), train_sizes // 4)
    assert "training pairs hidden (unlabeled)" in hidden.summary()
    # seeded: the same pairs again, others under another seed; no share, nothing hidden
    again = load_dataset(path, seed=5, hide_train_share=0.25)
    assert torch.equal(again.hidden[1], hidden.hidden[1]) and torch.equal(again.hidden[0], hidden.hidden[0])
    assert not torch.equal(load_dataset(path, seed=6, hide_train_share=0.25).hidden[1], hidden.hidden[1])
    assert clean.hidden is None
    for bad in (-0.1, 1.0, float("nan"), True, "0.1"):
        with pytest.raises(ValueError, match="hide_train_share must be a number in \\[0, 1\\)"):
            load_dataset(path, hide_train_share=bad)


def test_random_share_by_user_is_uniform_within_a_user():
    users = torch.zeros(10, dtype=torch.int64)
    picks = torch.stack([random_share_by_user(users, 1, 0.3, seed) for seed in range(2000)]).double()
    assert torch.equal(picks.sum(1), torch.full((2000,), 3.0))
    assert (picks.mean(0) - 0.3).abs().max() < 0.05  # each interaction about 30% of the time


# --------------------------------------------------------------------------- locating the data


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def no_data_variable(monkeypatch):
    monkeypatch.delenv("PNN_FAST_DATA", raising=False)


def test_data_dir_variable_wins(tmp_path, monkeypatch):
    (tmp_path / "shared" / "data").mkdir(parents=True)
    monkeypatch.setenv("PNN_FAST_DATA", str(tmp_path / "elsewhere"))
    assert default_data_dir(tmp_path / "repo") == tmp_path / "elsewhere"


def test_data_dir_beside_the_checkout(tmp_path, no_data_variable):
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "repo").mkdir()
    assert default_data_dir(tmp_path / "repo") == tmp_path / "shared" / "data"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_data_dir_of_a_throwaway_clone_is_its_origins(tmp_path, no_data_variable):
    """``git clone /work/main /tmp/ci-check`` (how CI checks a commit) reads /work/shared/data."""
    origin, data = tmp_path / "work" / "main", tmp_path / "work" / "shared" / "data"
    data.mkdir(parents=True)
    origin.mkdir()
    git("init", "-q", cwd=origin)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x", cwd=origin)
    git("clone", "-q", str(origin), str(tmp_path / "tmp" / "ci-check"), cwd=tmp_path)
    assert default_data_dir(tmp_path / "tmp" / "ci-check") == data
    # a clone of a clone finds nothing beside either, and names the folder beside itself
    git("clone", "-q", str(tmp_path / "tmp" / "ci-check"), str(tmp_path / "other" / "again"), cwd=tmp_path)
    assert default_data_dir(tmp_path / "other" / "again") == tmp_path / "other" / "shared" / "data"


def test_data_dir_outside_any_repository(tmp_path, no_data_variable):
    (tmp_path / "repo").mkdir()
    assert default_data_dir(tmp_path / "repo") == tmp_path / "shared" / "data"


# --------------------------------------------------------------------------- real data


def real(name: str) -> Path:
    folder = DATA / name
    if not folder.is_dir():
        pytest.skip(f"dataset {name} not found under {DATA} (set PNN_FAST_DATA)")
    return folder


def test_real_ml100k_inter():
    ds = load_dataset(real("ml-100k"))
    check_well_formed(ds)
    assert (ds.num_users, ds.num_items) == (943, 1682)
    sizes = [s[0].numel() for s in (ds.train, ds.valid, ds.test)]
    assert sum(sizes) == 100_000
    # Per-user counts of RecBole's rounding, summed over users.
    per_user = torch.bincount(torch.cat([ds.train[0], ds.valid[0], ds.test[0]]))
    assert sizes == split_counts(per_user, (0.8, 0.1, 0.1)).sum(0).tolist()
    assert ds.user_ids[:3] == [1, 2, 3]


def test_real_lastfm_files_split():
    ds = load_dataset(real("lastfm"))
    check_well_formed(ds)
    assert (ds.num_users, ds.num_items) == (1885, 17388)
    assert [s[0].numel() for s in (ds.train, ds.valid, ds.test)] == [64315, 9143, 18321]
    assert ds.user_ids == list(range(1885))  # contiguous 0-based ids map to themselves
    assert "91,779 interactions" in ds.summary()


def test_real_ml1m_full_remaps_and_carves_valid():
    ds = load_dataset(real("ml-1m-full"))
    assert (ds.num_users, ds.num_items) == (6040, 3706)
    sizes = [s[0].numel() for s in (ds.train, ds.valid, ds.test)]
    assert sizes[2] == 200_042 and sizes[0] + sizes[1] == 800_167 and sizes[1] > 0
    assert ds.item_ids[-1] == 3951  # MovieLens ids minus one, not contiguous


# --------------------------------------------------------------------------- synthetic


def test_synthetic_shapes_partition_and_seed():
    ds = synthetic_dataset(num_users=200, num_items=100, interactions_per_user=20, dim=4, seed=3)
    check_well_formed(ds)
    assert (ds.name, ds.num_users, ds.num_items, ds.user_ids, ds.item_ids) == ("synthetic", 200, 100, None, None)
    users = torch.cat([ds.train[0], ds.valid[0], ds.test[0]])
    assert torch.equal(torch.bincount(users, minlength=200), torch.full((200,), 20))
    counts = torch.stack([torch.bincount(s[0], minlength=200) for s in (ds.train, ds.valid, ds.test)], 1)
    assert torch.equal(counts[0], torch.tensor([16, 2, 2]))
    same = synthetic_dataset(num_users=200, num_items=100, interactions_per_user=20, dim=4, seed=3)
    assert torch.equal(same.test[1], ds.test[1])
    assert not torch.equal(synthetic_dataset(num_users=200, num_items=100, interactions_per_user=20, dim=4,
                                             seed=4).test[1], ds.test[1])
    with pytest.raises(ValueError, match="cannot exceed"):
        synthetic_dataset(num_items=10, interactions_per_user=11)


def _recall_at_20(ds: Dataset, scores: torch.Tensor) -> float:
    scores = scores.clone()
    scores[ds.train] = -float("inf")
    top = scores.topk(20, dim=1).indices
    hit = torch.zeros_like(scores, dtype=torch.bool)
    hit.scatter_(1, top, True)
    users, items = ds.test
    found = torch.zeros(ds.num_users).index_add_(0, users, hit[users, items].float())
    wanted = torch.bincount(users, minlength=ds.num_users).float()
    return (found[wanted > 0] / wanted[wanted > 0].clamp(max=20)).mean().item()


def test_synthetic_preferences_are_learnable_beyond_popularity():
    ds = synthetic_dataset()
    matrix = torch.zeros(ds.num_users, ds.num_items)
    matrix[ds.train] = 1.0
    popularity = _recall_at_20(ds, matrix.sum(0).expand(ds.num_users, -1))
    u, s, v = torch.linalg.svd(matrix, full_matrices=False)
    low_rank = _recall_at_20(ds, (u[:, :8] * s[:8]) @ v[:8])
    assert popularity > 0.08  # popularity is a real baseline (random is ~0.04)
    assert low_rank > 1.5 * popularity


def test_summary_line():
    ds = synthetic_dataset(num_users=10, num_items=40, interactions_per_user=10)
    assert ds.summary() == (
        "synthetic: 10 users, 40 items, 100 interactions (train 80 / valid 10 / test 10), density 25.0000%"
    )

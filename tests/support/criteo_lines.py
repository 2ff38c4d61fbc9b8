"""Criteo lines written by hand (not by this package), shared by the reader tests."""

import gzip

from sparse_dp.data.criteo_format import NUM_FIELDS

# Two lines in the published Criteo layout, written by hand (not by this package).
HAND_WRITTEN = [
    "0\t1\t1\t5\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t68fd1e64\t80e26c9b\tfb936136\t7b4723c4"
    "\t25c83c98\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\ta8cd5504\tb2cb9c98\t37c9c164"
    "\t2824a5f6\t1adce6ef\t8ba8b39a\t891b62e7\te5ba7672\tf54016b9\t21ddcdc9\tb1252a9d"
    "\t07b5194c\t\t3a171ecb\tc5c50484\te8b83407\t9727dd16",
    "1\t\t-1\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t",
]

# Malformed variants and the reason each reader must give.
BAD_LINES = [
    ("1\t2\t3", f"expected {NUM_FIELDS} tab-separated fields"),
    (HAND_WRITTEN[0].replace("0\t1\t1\t5", "2\t1\t1\t5", 1), "label '2' is not 0 or 1"),
    (HAND_WRITTEN[0].replace("\t1382\t", "\t13.5\t", 1), "int_5 = '13.5' is not an integer"),
    (HAND_WRITTEN[0].replace("\t1382\t", "\tabc\t", 1), "int_5 = 'abc' is not an integer"),
    (HAND_WRITTEN[0].replace("\t1382\t", "\t" + "1" * 19 + "\t", 1),
     f"int_5 = '{'1' * 19}' is not an integer of at most 18 digits"),
]


def write(path, lines, compress=False):
  opener = gzip.open if compress else open
  with opener(path, "wt") as out:
    out.write("\n".join(lines) + "\n")
  return path

"""The Criteo click-log text format (Criteo-Kaggle ``train.txt``, Criteo-1TB ``day_N``).

One example per line, tab-separated, no header: the label (0 or 1), 13 integer
features, 26 categorical features written as 8-digit hexadecimal hashes; any
feature may be empty (missing). Files may be gzip-compressed.
"""

from __future__ import annotations

NUM_INTEGER = 13
NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_INTEGER + NUM_CATEGORICAL

INTEGER_NAMES = tuple(f"int_{i}" for i in range(1, NUM_INTEGER + 1))
# An integer field: empty, or an optional "-" and 1-18 ASCII digits (|x| < 10^18, an int64;
# longer ones overflow TensorFlow's parser). Anything else makes the line malformed.
MAX_INTEGER_DIGITS = 18
INTEGER_PATTERN = rf"-?[0-9]{{1,{MAX_INTEGER_DIGITS}}}"
INTEGER_FAULT = f"is not an integer of at most {MAX_INTEGER_DIGITS} digits"
# Named as in Ghazi et al.'s (NeurIPS 2023) Table 3.
CATEGORICAL_NAMES = tuple(f"categorical-feature-{i}" for i in range(14, 14 + NUM_CATEGORICAL))

# Vocabulary sizes of the 26 categorical features, Ghazi et al., NeurIPS 2023, Table 3.
TABLE3_VOCABULARY_SIZES = (
    1472, 577, 82741, 18940, 305, 23, 1172, 633, 3, 9090, 5918, 64300, 3207,
    27, 1550, 44262, 10, 5485, 2161, 3, 56473, 17, 15, 27360, 104, 12934,
)
assert len(TABLE3_VOCABULARY_SIZES) == NUM_CATEGORICAL

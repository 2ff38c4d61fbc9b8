"""The epsilon a user reads names what it does not cover: batches that were not
Poisson-sampled, a fixed noise seed, un-noised debug metrics (``sparse_dp.accounting.Epsilon``,
``PrivacyReport.statement``)."""

from __future__ import annotations

import json

import numpy as np

import sparse_dp
from sparse_dp.accounting import Epsilon
from sparse_dp.accounting.report import FIXED_NOISE_SEED, NOT_POISSON

from support.keras_models import one_table_model

N, B, VOCAB = 64, 16, 20


def private_model(noise_seed=None):
  model = one_table_model(VOCAB)
  config = sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0, noise_seed=noise_seed)
  return model, sparse_dp.make_private(model, config, num_examples=N, batch_size=B)


def data():
  rng = np.random.default_rng(0)
  return rng.integers(0, VOCAB, N).astype("int64"), rng.integers(0, 2, (N, 1)).astype("float32")


def test_an_epsilon_of_plain_arrays_prints_that_it_is_not_proved():
  model, private = private_model()
  model.fit(*data(), batch_size=B, verbose=0)
  epsilon = private.epsilon()
  assert isinstance(epsilon, float) and not epsilon.proved
  for printed in (str(epsilon), repr(epsilon), f"{epsilon:.3f}", f"epsilon = {epsilon}"):
    assert NOT_POISSON in printed
  assert json.loads(json.dumps({"epsilon": epsilon}))["epsilon"] == float(epsilon)
  assert epsilon + 0.0 == float(epsilon)  # arithmetic is the number's


def test_a_poisson_run_with_a_secret_seed_prints_the_bare_number():
  model, private = private_model()
  model.fit(private.poisson_dataset(*data()), verbose=0)
  epsilon = private.epsilon()
  assert epsilon.proved and epsilon.caveats == ()
  assert f"{epsilon:.3f}" == f"{float(epsilon):.3f}"
  assert "noise_seed" not in private.report().statement()


def test_a_fixed_noise_seed_is_named_with_the_epsilon_and_in_the_statement():
  model, private = private_model(noise_seed=7)
  model.fit(private.poisson_dataset(*data()), verbose=0)
  epsilon = private.epsilon()
  assert epsilon.proved and FIXED_NOISE_SEED in str(epsilon)
  assert FIXED_NOISE_SEED in private.report().statement()
  assert private.report().to_dict()["fixed_noise_seed"] is True
  assert FIXED_NOISE_SEED in private.epsilon_text(epsilon)


def test_an_epsilon_object_keeps_its_caveats_in_every_format():
  epsilon = Epsilon(1.25, ("a caveat",))
  assert f"{epsilon:.2f}" == "1.25 (a caveat)" and str(epsilon) == "1.25 (a caveat)"
  assert f"{epsilon}" == "1.25 (a caveat)" == repr(epsilon)  # once, not once per str
  assert Epsilon(1.25) == 1.25 and str(Epsilon(1.25)) == "1.25"

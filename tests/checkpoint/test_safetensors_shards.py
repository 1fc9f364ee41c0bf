"""`shard_safetensors` (the pair pipeline's packing, jaxspec/training/ende_pair.py): a model.safetensors over the
limit becomes transformers' sharded layout, read back tensor for tensor; one within it stays as it is."""

import json
import os

import numpy as np

from jaxspec.checkpoint.hf_dir import TensorSource
from jaxspec.checkpoint.safetensors_io import save_file, shard_groups, shard_safetensors


def _tensors():
  rng = np.random.RandomState(0)  # 400, 200, 1200 and 40 bytes, in this order
  return {"a": rng.randn(100).astype(np.float32), "b": rng.randn(5, 10).astype(np.float32),
          "c": rng.randn(300).astype(np.float32), "d": np.arange(10, dtype=np.int32)}


def test_groups_keep_order_and_give_a_larger_item_its_own_shard():
  assert shard_groups([("a", 400), ("b", 200), ("c", 1200), ("d", 40)], 600) == [["a", "b"], ["c"], ["d"]]
  assert shard_groups([("a", 400), ("b", 200)], 10**6) == [["a", "b"]]


def test_over_the_limit_is_sharded_with_an_index(tmp_path):
  tensors = _tensors()
  save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  shard_safetensors(str(tmp_path), 600)
  files = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
  assert sorted(os.listdir(tmp_path)) == files + ["model.safetensors.index.json"]
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  assert index["metadata"]["total_size"] == 1840
  assert index["weight_map"] == {"a": files[0], "b": files[0], "c": files[1], "d": files[2]}
  source = TensorSource(str(tmp_path))
  for name, value in tensors.items():
    np.testing.assert_array_equal(source.get(name), value)


def test_within_the_limit_is_left_as_it_is(tmp_path):
  save_file(_tensors(), str(tmp_path / "model.safetensors"))
  before = (tmp_path / "model.safetensors").read_bytes()
  shard_safetensors(str(tmp_path), len(before))  # the file's size, header included
  assert os.listdir(tmp_path) == ["model.safetensors"] and (tmp_path / "model.safetensors").read_bytes() == before

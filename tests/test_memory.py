from conftest import make_tiny_model
from quickdraft.memory import kv_bytes_per_token, sequence_kv_bytes, weight_bytes


def test_kv_bytes_per_token_matches_the_real_cache():
    import torch

    from quickdraft.runner import ModelRunner

    model = make_tiny_model(seed=0, hidden_size=16, num_layers=2)
    runner = ModelRunner(model)
    runner.forward([1, 2, 3, 4, 5])
    cache = runner._cache
    stored = sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size() for layer in cache.layers)
    assert stored == 5 * kv_bytes_per_token(model)
    assert sequence_kv_bytes([model, model], 10) == 20 * kv_bytes_per_token(model)
    assert weight_bytes(model) >= sum(p.numel() * 4 for p in model.module.parameters())
    assert model.module.dtype == torch.float32

"""The llama.cpp oracle files in tests/fixtures are the ones llama.cpp wrote: byte for byte."""

from __future__ import annotations

import hashlib

import pytest

SHA256 = {
    "smollm2/cases.json": "d2d030fec406bc071882f7bf02c8de18c54acdc932c0eea16ef8c34aefbecb59",
    "smollm2/llamacpp.json": "42cb555cbcfd66d7dadef918391d49dae06c13742dea1b594ecb136aa902d93e",
    "text/gpl-3.txt": "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986",
    # made here by scripts/llamacpp_fixtures.py (tests/fixtures/README.md)
    "gemma3-270m/cases.json": "192c786bae6922f737908f77f7e1de10d81ab844a5ca41bdde31724f2a55865e",
    "gemma3-270m/llamacpp.json": "ea99806df86caa38fa12140aa0324cf77e4d7d68fdd594f59247db5c6a9d977f",
    "tiny-gemma2/cases.json": "db8de73e406f28106ab670ad9bc18bf6807cab4bc1e95a2106d1944d7dfd179c",
    "tiny-gemma2/llamacpp.json": "d4e2ed2ca4bf0c562083f9baf2244b84ebdf592f5b8351100cd69b3ec6911e47",
    "tiny-gemma3/cases.json": "db8de73e406f28106ab670ad9bc18bf6807cab4bc1e95a2106d1944d7dfd179c",
    "tiny-gemma3/llamacpp.json": "a50adcb2a36960cde9420d24c065c2e5de54333a3ab6874563bb50e09d80a7d0",
    "tiny-phi3/cases.json": "f8c2224a785a8e1259b7f0aece152c79ef17c4ffbfa8a3f719909363d2582660",
    "tiny-phi3/llamacpp.json": "3fb3ba3f15d4cdb959c5d6b877fde7ff1784560c4d593ea7028bbb4f323ae1ce",
    "tiny-qwen3/cases.json": "3b5a54919e58dfd08b9e093a5344911f4114bb37f396a46f0e77ba9b765a1fef",
    "tiny-qwen3/llamacpp.json": "0f3d649f408094c47d24a6b784645cce55d4578f121d8ec06dceb486d4ec8ee1",
    "tiny-llama-iq4_nl/cases.json": "3b5a54919e58dfd08b9e093a5344911f4114bb37f396a46f0e77ba9b765a1fef",
    "tiny-llama-iq4_nl/llamacpp.json": "e08351b11c46df7cc931d67ed4b4a805920fefe5b9858ea78bdaac171873673a",
    "tiny-llama-iq4_xs/cases.json": "3b5a54919e58dfd08b9e093a5344911f4114bb37f396a46f0e77ba9b765a1fef",
    "tiny-llama-iq4_xs/llamacpp.json": "d8e492b98f38016acdbe9fd5b22d031e592f54387169cd9813f694e047b48e92",
    "tiny-llama-mxfp4/cases.json": "3b5a54919e58dfd08b9e093a5344911f4114bb37f396a46f0e77ba9b765a1fef",
    "tiny-llama-mxfp4/llamacpp.json": "087cd3cb1cdb905ec6113bf2b3f5b86e2ec8dbe1bcc665ebe4a6558f98456f75",
    "tiny-mixtral/cases.json": "fce2c99722eb9441a6c7f6f8a2817461a13b9afdcab23168760c778524ea888d",
    "tiny-mixtral/llamacpp.json": "6d024119423ad2b42e714a5d43b75f7bd1e0f3b2540a769f65d067bf15774782",
    "tiny-qwen3moe/cases.json": "3b5a54919e58dfd08b9e093a5344911f4114bb37f396a46f0e77ba9b765a1fef",
    "tiny-qwen3moe/llamacpp.json": "91547a293c52dac9533196444c1c4e2b29b72b80b2831e815247e43485fcfd34",
    "tiny-gpt-oss/cases.json": "bd2ff80dc6f826d4239361c606af87865afbb63facee55696bd48e0aad99349e",
    "tiny-gpt-oss/llamacpp.json": "edb7a6b228de5ddbada9e8603807e3ee6059da6486d333480c76ff748ac0b8f9",
    "tiny-gpt-oss-mxfp4/cases.json": "bd2ff80dc6f826d4239361c606af87865afbb63facee55696bd48e0aad99349e",
    "tiny-gpt-oss-mxfp4/llamacpp.json": "6cd949478e5536f7529bdf410aeb95f8072f2e2d67ed499579472408d8008590",
}


@pytest.mark.parametrize("name", sorted(SHA256))
def test_oracle_file_is_unchanged(fixtures_dir, name):
    assert hashlib.sha256((fixtures_dir / name).read_bytes()).hexdigest() == SHA256[name]

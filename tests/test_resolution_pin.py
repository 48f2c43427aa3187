"""What resolving a run config gives, pinned for every shipped preset, so that reorganising how a config is resolved
(issue 50, "the config is resolved once") cannot change what a run, a checkpoint or a feature cache records.

For each preset the digest covers the resolved config as a run folder and a checkpoint write it
(``config_to_dict``), the tokenizer its backbone names, what its frozen features are a function of, and the settings
a feature cache built from it records. A digest that changes means presets, checkpoints or caches written before
would no longer match: that is a behaviour change, never a refactoring. ``python tests/test_resolution_pin.py``
prints the current digests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tvr.config import Config, available_presets, config_to_dict, load_config
from tvr.data.feature_cache import cache_settings
from tvr.models.backbones.registry import backbone_spec
from tvr.pipeline import resolve_config

#: sha256 of :func:`resolution_record` per shipped preset, at main 1a3008a (before item 3 of issue 50)
PINNED = {
    "clip4clip/activitynet": "7842d3d904b96785827f62bee0016986ee548bbffd4abf665b898d2d059c2c34",
    "clip4clip/didemo": "8e07a8d99db39e269c1db1d7ad322a34a30008f8a578c7fc006e86508d9df124",
    "clip4clip/generic": "1cd656142e60a1284ec0b9058b56f88b44f4395a1fa3bd88a848acc58235bdef",
    "clip4clip/msrvtt": "7bf0f592ac1cd1a073a98d27ee518f48614d0ad23108c82c15c93e5317dd2d26",
    "clip4clip/msrvtt_meanp": "a347cbea635a910a7a1e6f96fca557af464198a72a1e582e9030432e0361422d",
    "clip4clip/msvd": "d64cdf8d7280d943160a5c268e00bfaa8061a0d2737304e90661705de849c6ee",
    "clipvip/activitynet": "8af4721c45ae271ea93c3414c3d334172aa950f0a44a70a22edd4ddecb94f200",
    "clipvip/didemo": "0764998d3aa790bb89f4e4565573871fa00e4c4cdeba34fcf8cc96a0a99623eb",
    "clipvip/msrvtt": "86f7b304fdddc854fa23ff23d1fda4269818b9fc3ab6487e5635c85a09dcbdc2",
    "clipvip/msrvtt_b16": "0d7dade45a1cc9891879399a67b9e3ec4f107538b3d6117b20f4d368caa91016",
    "cpu/clip4clip": "e0fa6d0d9456a22a6bc7210232b32dd0a150b40d94bc692656d3651a08c7b7be",
    "cpu/frozen_msrvtt": "e5a3c279e6b5912b90e64a38bed49824b51ccfe3eb0fdc9278957965229cc0e5",
    "cpu/gare": "46687bce955441e1d3372000b454ef26d649b1b7bcc1e3b43e7a27b4ddf44759",
    "cpu/gravialign": "1ec9b1ca9195bf41e3c6cd61a6aa702fe54bf12dda4876d6dbc1a323a90b7cba",
    "cpu/proxy": "ff38913d62c7b35c971b2660d3d7c68f4ba644c232b864ce5e150b9f627042a0",
    "gare/ablations/all": "814622ed3ddaac08a6f774def986c6039a4337b7fdda60b3e1fbc4e1e2878951",
    "gare/ablations/baseline": "0bdc90357e8f025e941a2621aaaf3a451135a9c2ad9eb8c94f4102be29a18768",
    "gare/ablations/delta_direction": "f69e2069d23b807d691d0cd57d256e6357f56dcc335884d26eebb8e7683b2862",
    "gare/ablations/delta_ib": "8e7e8d77fd75325ea1ebb4a46689c0b7c33d8ffc774a8ba8e65af889d21e2a78",
    "gare/ablations/delta_only": "79079599900726a55bcfd07858a85b7ea7ec8345862ad15b698e9a9694857129",
    "gare/ablations/delta_radius": "57bd1027528c2694c67c6dbce27bf0a88355de92530792685f4e82b4aac1fc49",
    "gare/ablations/delta_radius_direction": "29b92c7626e254c5f3ff478d8ef44df23357f412eb5ebc5fb529d2f330f8b756",
    "gare/ablations/grid_text_frames_neg": "43c885278c7a0ceb2c9ff8519c04682a3ae61799f0f28e43256e30a59bf2f6dc",
    "gare/ablations/grid_text_words_neg": "a6b1cf90bedfa61e0997e066730e6fdbd69ed5778bca8f4c6f0d679c02c81668",
    "gare/ablations/grid_text_words_pos": "c35ba75a08e108086a775b73c32dc7243b42c9d925ee892246b793d577185cd6",
    "gare/ablations/grid_video_frames_neg": "126241ffb8cb9f5cdf1eade46232e25c74378b4eacd54df806c0143930008f51",
    "gare/ablations/grid_video_frames_pos": "29d525464549caef315e714d9c1aecc926f8220133b0d1da1e07ac833d20c0a7",
    "gare/ablations/grid_video_words_neg": "604ee52ae32d7f3787c67acbc9f8e67ab76268921bfd4c74124f99ab719746d8",
    "gare/ablations/grid_video_words_pos": "c404105c7cc1b1480f328a860885f0144fe18f30863801027613ba0c9bc35914",
    "gare/ablations/kl_mean": "5add6ae5d603b3791b2d376a07b7d031480225b01afb0359b58f06959b3c7fe9",
    "gare/ablations/mean_pool": "335bc3070258a6e7b30ca95ce6f36f7e4db1be429d274ca6b5b2a0cd38c22de0",
    "gare/ablations/no_gap_query": "f497038ce8c08bc60cbc4de6a909e7a75ab37c068d23799d957128e6499d05d2",
    "gare/ablations/release_2026_05_31": "814622ed3ddaac08a6f774def986c6039a4337b7fdda60b3e1fbc4e1e2878951",
    "gare/activitynet": "900240ca7429cf47d8a9e26e3fad5c9f6b08432eb0cdcf325412802bd4c4df70",
    "gare/didemo": "816510f068d70e1b60b077e984eac1ffe6b5806c5b74f4dfe37ee20b5fc663d2",
    "gare/msrvtt": "814622ed3ddaac08a6f774def986c6039a4337b7fdda60b3e1fbc4e1e2878951",
    "gare/msvd": "fb4344eeb94bf3b26b3aeb44daf6a73467e4beb1a893a6e8a78ad8502053e50e",
    "gravialign/ablations/contrastive": "8d09d319bc9c1f4f0f9cac9e94b6f77d0ea60e910a35dbbdbdb8365592df366a",
    "gravialign/ablations/guarded": "d59adc848d271989df3522708c93bfefd1579b57bb457fa286174d2487db1004",
    "gravialign/ablations/literal": "1b1f91cece51fb7e6a43b4dd5bd1247bed529689d904cc107bb8c8d9dcb5ad7e",
    "gravialign/ablations/no_a": "7ad3f5ea2fefa62a1001f40a9ea98d61138d6dcf202d75e3c8e2577def88131f",
    "gravialign/ablations/no_b": "17eb24408c566e73afa691d3a40ddb06df61326da1d47c2fe1e816f32ed21b60",
    "gravialign/ablations/no_c": "96d348845926945153f96cd0a90962a461b920de27a948601340a0e4d4d2d17d",
    "gravialign/ablations/soft_a": "2764d5e8505982182e868f40c5ccc99f3508802bb9cbfc82b14525a288083e8e",
    "gravialign/activitynet": "1c1571b0df11df04b833568abd6bd39af9e0a17f9ac74eb2153e65a714a5a139",
    "gravialign/didemo": "675df70a01e9c484125139d32978bf974a3d4b1b3028075db3f6dcd7b3a608d6",
    "gravialign/msrvtt": "6103ee98234d5cc2dccfb39073a2c1f96457ba5b026c2c25a012ab4a43ed0e93",
    "gravialign/msrvtt_b16": "e6b16ca60e87d5d93c1e829d98204da0a45ea57dd6e9bb405770e22a00d892de",
    "proxy/activitynet": "d32b542c08711939c0bc301b578aff0a71cc114fe6a4eef701b77b99c1e62c45",
    "proxy/baseline": "ecac5bcf8dac96ac4465efcbadb5f0080b41b34e1456c3aee409014de1e766ec",
    "proxy/didemo": "fba88a6d49ead45876a340b24192d2fd8e4009a6a40e18bd2e2d9dfceb100a80",
    "proxy/msrvtt": "ec0bad4fbc7ea9324ff80e61f61b30b7e84136a80abe248a84080f0eb9c94ce6",
    "proxy/msrvtt_b16": "e428ae5d194ec152e7898c25635c5af1dba7e37c99a203b8b99485e972689a39",
    "two_tower/msrvtt": "f8fb3f94cbf9e173bf0252cfc34bcbe107193e9b0107542b15c0fd21d9549685",
    "two_tower/zero_shot": "ef1fdca7242f30e16295fb74c4544c61227733c41f999ec315f58a0dd1878a13",
}


def resolution_record(preset: str) -> dict[str, Any]:
    """Everything resolving ``preset`` decides that a run, a checkpoint or a feature cache records."""
    return record_of(load_config(preset))


def record_of(loaded: Config) -> dict[str, Any]:
    """What resolving the loaded config ``loaded`` decides (see :func:`resolution_record`)."""
    cfg = resolve_config(loaded)
    backbone = backbone_spec(cfg.model.backbone)
    return {
        "config": config_to_dict(cfg),
        "tokenizer": dataclasses.asdict(backbone.tokenizer(cfg.model)),
        "feature_identity": dataclasses.asdict(backbone.feature_identity(cfg)),
        "cache_settings": cache_settings(cfg, backbone.feature_identity(cfg), 64, torch.float16),
    }


def digest(record: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def test_every_preset_is_pinned() -> None:
    assert sorted(PINNED) == available_presets()


@pytest.mark.parametrize("preset", sorted(PINNED))
def test_a_preset_resolves_as_before(preset: str) -> None:
    assert digest(resolution_record(preset)) == PINNED[preset]


def test_a_config_loaded_before_any_backbone_resolves_the_same() -> None:
    """The command line loads a config before anything imports the backbones, so the built-in backbones' sections
    are still mappings when it is resolved: resolving types them, and every preset gives its pinned record."""
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from tvr.config import available_presets, load_config
loaded = {{name: load_config(name) for name in available_presets()}}
assert "tvr.models.backbones.registry" not in sys.modules
import test_resolution_pin as pin
differ = [name for name, cfg in loaded.items() if pin.digest(pin.record_of(cfg)) != pin.PINNED[name]]
print(differ)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("preset", ["cpu/clip4clip", "cpu/proxy", "clipvip/msrvtt", "two_tower/msrvtt"])
def test_resolving_a_resolved_config_changes_nothing(preset: str) -> None:
    once = resolve_config(load_config(preset))
    assert config_to_dict(resolve_config(load_config(preset))) == config_to_dict(resolve_config(once))


if __name__ == "__main__":
    for name in available_presets():
        print(f'    "{name}": "{digest(resolution_record(name))}",')

"""Read siphon activation datasets from Python and train on them.

    import siphon
    ds = siphon.open_dataset("gs://bucket/activations/qwen7b-l20-27")   # a local path, s3://, gs://
    ds.hooks                      # {name: HookInfo(shape=(d,), dtype="bfloat16")}
    ds.tokens, ds.verify()
    for batch in ds.batches(hooks=["blocks.20.hook_resid_post"], batch_size=4096,
                            shuffle=True, seed=0, output="torch"):
        x = batch["blocks.20.hook_resid_post"]   # [4096, d] torch.bfloat16
        ids = batch["token_ids"]

Runs extracted with ``--dtype fp8`` (float8_e4m3fn and a float32 scale per token row) read
the same way: their hooks come dequantized, float32 unless ``dtype=`` asks for another.

`siphon.stream(url, ...)` reads the batches ``siphon extract --output stream://HOST:PORT``
serves while it runs, no disk between. `siphon.torch` holds the PyTorch IterableDataset and SAELens/dictionary_learning data
providers; `siphon.saelens` exports a run as SAELens's cached-activation dataset.

A run extracted with dictionaries (``--sae``) also stores their latents, sparse: ``ds.latents``
names them, ``ds.read_latents(name, format="csr" | "triples")`` reads them shard by shard, and
`siphon.delphi` exports them as delphi's latent cache.
"""

from ._convert import Batch
from ._format import ROLES
from .dataset import Dataset, HookInfo, VerifyReport, open, open_dataset
from .errors import DatasetError
from .latents import LatentShard, LatentsInfo
from .stream import Stream, stream

__version__ = "0.1.0"

__all__ = ["Batch", "Dataset", "DatasetError", "HookInfo", "LatentShard", "LatentsInfo", "ROLES", "Stream", "VerifyReport", "open", "open_dataset", "stream",
           "__version__"]

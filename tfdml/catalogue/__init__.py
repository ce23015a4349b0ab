"""`tfdml embed`'s engine-agnostic half: the output folder's files (`files`) and the steps every engine's
driver runs (`steps`: read, decode, embed with the export's serving signature, shard, index, and the
retrieval sums of a query shard). `tfdml.beam` (Apache Beam) and `tfdml.ray` (Ray Data) are thin drivers over
them; neither engine is imported here."""

from tfdml.catalogue import files, steps

__all__ = ["files", "steps"]

// Package viz draws the replay of a trace through the caching allocator:
// a timeline of requested, allocated and reserved memory, and a map of
// the segments at the moment reserved memory peaked, as one standalone
// SVG.
//
// Replay runs replay.Run on the allocator's device and samples the
// allocator's stats after every batch of ops (64 by default); the Picture
// it returns holds the samples and the allocator's segments
// (allocator.SegmentInfo) at the highest reserved point it saw. WriteSVG draws the
// samples as three lines (the longest traces are downsampled, keeping the
// peak of each stretch): reserved; requested, as a wide pale band; and
// allocated, a thin line drawn over it, since the two are often almost
// equal. The byte axis has round ticks (1, 2 or 5 times a power of ten of
// B, KiB, MiB, GiB or TiB) and ends at the first one above the highest
// sample. Below, the segments are rows of blocks coloured by state:
// allocated, freed but waiting for stream work, free. Hovering shows SVG
// titles: a line's highest sample and its op, a block's address, size,
// state and requested bytes with its segment's. Nothing is written until
// the whole picture is drawn.
package viz

// This file holds the named accelerator cards.

package estimate

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpumem/gpumem/internal/quote"
)

// Card is an accelerator and its memory.
type Card struct {
	Name     string
	Memory   uint64 // bytes: the nominal size, in GiB as the vendor counts it
	Describe string
}

const gib = 1 << 30

var cards = []Card{
	{"t4-16g", 16 * gib, "NVIDIA T4 16 GB"},
	{"v100-16g", 16 * gib, "NVIDIA V100 16 GB"},
	{"v100-32g", 32 * gib, "NVIDIA V100 32 GB"},
	{"rtx3060-12g", 12 * gib, "NVIDIA GeForce RTX 3060 12 GB"},
	{"rtx3080-10g", 10 * gib, "NVIDIA GeForce RTX 3080 10 GB"},
	{"rtx3090-24g", 24 * gib, "NVIDIA GeForce RTX 3090 24 GB"},
	{"rtx4060ti-16g", 16 * gib, "NVIDIA GeForce RTX 4060 Ti 16 GB"},
	{"rtx4080-16g", 16 * gib, "NVIDIA GeForce RTX 4080 16 GB"},
	{"rtx4090-24g", 24 * gib, "NVIDIA GeForce RTX 4090 24 GB"},
	{"rtx5090-32g", 32 * gib, "NVIDIA GeForce RTX 5090 32 GB"},
	{"a10-24g", 24 * gib, "NVIDIA A10 / A10G 24 GB"},
	{"l4-24g", 24 * gib, "NVIDIA L4 24 GB"},
	{"a6000-48g", 48 * gib, "NVIDIA RTX A6000 48 GB"},
	{"l40s-48g", 48 * gib, "NVIDIA L40S 48 GB"},
	{"a100-40g", 40 * gib, "NVIDIA A100 40 GB"},
	{"a100-80g", 80 * gib, "NVIDIA A100 80 GB"},
	{"h100-80g", 80 * gib, "NVIDIA H100 80 GB (SXM, PCIe)"},
	{"h100-94g", 94 * gib, "NVIDIA H100 NVL 94 GB"},
	{"h200-141g", 141 * gib, "NVIDIA H200 141 GB"},
	{"b200-180g", 180 * gib, "NVIDIA B200 180 GB"},
	{"mi250x-128g", 128 * gib, "AMD Instinct MI250X 128 GB"},
	{"mi300x-192g", 192 * gib, "AMD Instinct MI300X 192 GB"},
}

// LookupCard returns the card of that name (see CardNames).
func LookupCard(name string) (Card, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if i := slices.IndexFunc(cards, func(c Card) bool { return c.Name == n }); i >= 0 {
		return cards[i], nil
	}
	return Card{}, fmt.Errorf("unknown card %s (want one of %s, or --capacity SIZE)", quote.Quote(name), strings.Join(CardNames(), ", "))
}

// CardNames returns the names of the known cards.
func CardNames() []string {
	names := make([]string, len(cards))
	for i, c := range cards {
		names[i] = c.Name
	}
	return names
}

package engine

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/cdc"
)

// TestVoucherVouchesForTheNewestSettledPosition covers the confirm limit's rule without a server:
// a position is vouched for by a later check once it is minVouchAge old, unless a transaction
// running at its check now waits for a synchronous standby (its commit may lie before the
// position yet be invisible), and only after syncRepBlindAge when such waits cannot be seen.
func TestVoucherVouchesForTheNewestSettledPosition(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	tests := []struct {
		name    string
		entries []vouchEntry
		probe   cdc.CatalogProbe
		now     time.Time
		want    pglogrepl.LSN // 0: none
		left    int           // entries kept after the vouch
	}{
		{name: "nothing recorded", now: at(time.Second)},
		{name: "too young", entries: []vouchEntry{{at: 100, read: at(0)}}, now: at(minVouchAge - time.Millisecond), left: 1},
		{name: "settled", entries: []vouchEntry{{at: 100, read: at(0)}}, now: at(minVouchAge), want: 100},
		{
			name:    "newest settled one wins, younger ones stay",
			entries: []vouchEntry{{at: 100, read: at(0)}, {at: 200, read: at(200 * time.Millisecond)}, {at: 300, read: at(400 * time.Millisecond)}},
			now:     at(450 * time.Millisecond), want: 200, left: 1,
		},
		{
			name:    "a transaction running at the check waits for a standby now",
			entries: []vouchEntry{{at: 100, running: []uint64{7}, read: at(0)}, {at: 200, running: []uint64{7, 9}, read: at(200 * time.Millisecond)}},
			probe:   cdc.CatalogProbe{SyncStandbys: true, WaitsVisible: true, Unseen: []uint64{9}},
			now:     at(time.Second), want: 100, left: 1,
		},
		{
			name:    "every check had it running",
			entries: []vouchEntry{{at: 100, running: []uint64{7}, read: at(0)}, {at: 200, running: []uint64{5, 7}, read: at(200 * time.Millisecond)}},
			probe:   cdc.CatalogProbe{SyncStandbys: true, WaitsVisible: true, Unseen: []uint64{3, 7}},
			now:     at(time.Second), left: 2,
		},
		{
			name:    "a waiting transaction that started after the check does not matter",
			entries: []vouchEntry{{at: 100, running: []uint64{7}, read: at(0)}},
			probe:   cdc.CatalogProbe{SyncStandbys: true, WaitsVisible: true, Unseen: []uint64{8}},
			now:     at(time.Second), want: 100,
		},
		{
			name:    "one running at the check committed unseen by the later probe (no wait seen)",
			entries: []vouchEntry{{at: 100, running: []uint64{7}, read: at(0)}},
			probe:   cdc.CatalogProbe{Unseen: []uint64{7}},
			now:     at(time.Second), left: 1,
		},
		{
			name:    "a COMMIT PREPARED waits: its transaction is unknown",
			entries: []vouchEntry{{at: 100, read: at(0)}},
			probe:   cdc.CatalogProbe{SyncStandbys: true, WaitsVisible: true, Unseen: []uint64{0}},
			now:     at(time.Second), left: 1,
		},
		{
			name:    "waits unseen: syncRepBlindAge",
			entries: []vouchEntry{{at: 100, read: at(0)}, {at: 200, read: at(time.Second)}},
			probe:   cdc.CatalogProbe{SyncStandbys: true},
			now:     at(syncRepBlindAge + 500*time.Millisecond), want: 100, left: 1,
		},
		{
			name:    "no standby: waits unseen do not matter",
			entries: []vouchEntry{{at: 100, read: at(0)}, {at: 200, read: at(time.Second)}},
			probe:   cdc.CatalogProbe{},
			now:     at(2 * time.Second), want: 200,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := voucher{entries: tc.entries}
			got, ok := v.vouch(tc.probe, tc.now)
			if ok != (tc.want != 0) || got != tc.want {
				t.Fatalf("vouch = %v, %v; want %v", got, ok, tc.want)
			}
			if len(v.entries) != tc.left {
				t.Fatalf("%d entries left, want %d: %+v", len(v.entries), tc.left, v.entries)
			}
		})
	}
}

// TestVoucherKeepsABoundedHistory checks that add keeps the newest maxVouchEntries positions.
func TestVoucherKeepsABoundedHistory(t *testing.T) {
	var v voucher
	t0 := time.Unix(1_000_000, 0)
	for i := range maxVouchEntries + 10 {
		v.add(pglogrepl.LSN(i+1), nil, t0.Add(time.Duration(i)*time.Millisecond))
	}
	if len(v.entries) != maxVouchEntries || v.entries[0].at != 11 {
		t.Fatalf("kept %d entries from %v, want %d from 11", len(v.entries), v.entries[0].at, maxVouchEntries)
	}
}

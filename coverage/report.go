package coverage

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage/gaps"
)

// Status is a table's coverage status in a Report.
type Status string

// Table statuses. Every status but Covered, SnapshotOnly and Retired fails a coverage check
// (Status.Failing).
const (
	// Covered: every change below the watermark was delivered by a backfill or the stream.
	Covered Status = "covered"
	// GapStatus: some LSN range below the watermark was delivered by no path.
	GapStatus Status = "gap"
	// Loading: a backfill of the table runs now; until it completes, the table has a gap.
	Loading Status = "loading"
	// NeverLoaded: the table never completed a backfill into its current target table.
	NeverLoaded Status = "never-loaded"
	// SchemaChanged: the source table gained a column or a column changed type, and no backfill
	// completed since: the target's existing rows lack the source's values (the daemon loads the
	// table again).
	SchemaChanged Status = "schema-changed"
	// NotStreamed: no stream follows the table now (it left the daemon's selection), and nobody
	// said that is meant (Retired): its target copy stopped following the source at its
	// watermark, which fails a coverage check until the table is selected again or retired.
	NotStreamed Status = "not-streamed"
	// Retired: no stream follows the table, on purpose (Retire): its target copy holds the source
	// as of its last watermark. It is not counted as a gap.
	Retired Status = "retired"
	// SnapshotOnly: no publication can carry the table's changes (it is UNLOGGED, or has no key
	// and no REPLICA IDENTITY FULL); backfills keep it, and the target holds it as of the last
	// one's snapshot (last_backfill_lsn, snapshot_age_seconds). It is not counted as a gap.
	SnapshotOnly Status = "snapshot-only"
)

// Failing reports whether a table of status s fails a coverage check (coverage --fail-on-gap):
// every status but Covered, SnapshotOnly and Retired, which have no change missing that a path
// was meant to deliver.
func (s Status) Failing() bool { return s != Covered && s != SnapshotOnly && s != Retired }

// LSN is an LSN printed X/Y in reports, JSON included.
type LSN pglogrepl.LSN

// MarshalText returns the LSN as X/Y.
func (l LSN) MarshalText() ([]byte, error) { return []byte(pglogrepl.LSN(l).String()), nil }

// UnmarshalText parses an LSN written X/Y.
func (l *LSN) UnmarshalText(b []byte) error {
	v, err := pglogrepl.ParseLSN(string(b))
	*l = LSN(v)
	return err
}

// String returns the LSN as X/Y.
func (l LSN) String() string { return pglogrepl.LSN(l).String() }

// Report is the coverage of every table the ledger registers; its JSON form is documented in
// docs/coverage.md and stays stable.
type Report struct {
	// SourceLSN is the source's current WAL position when the report was made.
	SourceLSN LSN `json:"source_lsn"`
	// Covered is true when no table's status is failing (Status.Failing).
	Covered bool          `json:"covered"`
	Slots   []SlotHealth  `json:"slots"`
	Tables  []TableReport `json:"tables"`
	// Waiting are the selected tables that a running daemon leaves to the running daemon of
	// another slot and waits for, by slot then table (Facts.Waits); empty when none does.
	Waiting []Wait `json:"waiting"`
}

// Table returns the report of the table named name (as changebatch.TableName.String prints it),
// and false when the report has none.
func (r Report) Table(name string) (TableReport, bool) {
	for _, t := range r.Tables {
		if t.Table == name {
			return t, true
		}
	}
	return TableReport{}, false
}

// TableReport is one table's coverage.
type TableReport struct {
	Table  string `json:"table"`
	Status Status `json:"status"`
	// BackfillLSN is the S the table counts as backfilled at (smallest S of the chunks of its last
	// completed backfill); nil when it never completed one.
	BackfillLSN *LSN `json:"last_backfill_lsn"`
	// Slot and StreamStartLSN: the slot whose stream follows the table, continuously since then.
	Slot           string `json:"slot,omitempty"`
	StreamStartLSN *LSN   `json:"stream_start_lsn"`
	// WatermarkLSN is the position up to which the target holds every change streamed for it;
	// LagBytes how far the source's current position is beyond it.
	WatermarkLSN LSN    `json:"watermark_lsn"`
	LagBytes     uint64 `json:"lag_bytes"`
	// Following is true while a daemon streams the table: its slot is held by a walsender
	// (pg_replication_slots.active). A covered table that is not Following is covered only up to
	// a watermark that no longer moves: the note says since when (WatermarkAgeSeconds, how long
	// ago the stream last recorded its progress).
	Following           bool    `json:"following"`
	WatermarkAgeSeconds float64 `json:"watermark_age_seconds"`
	// GapBytes sums the gaps' sizes; Gaps lists them in LSN order.
	GapBytes uint64      `json:"gap_bytes"`
	Gaps     []GapReport `json:"gaps"`
	// RowFilter is the row filter of the table's publication ("" for none): the table is covered
	// as filtered by it, the target holding only the rows it admits.
	RowFilter string `json:"row_filter,omitempty"`
	// ColumnList names the columns the table's publication lists (nil: every column): only
	// those are replicated.
	ColumnList []string `json:"column_list,omitempty"`
	// SnapshotAgeSeconds is, for a snapshot-only table, how long ago its last backfill completed;
	// KeptBy the slot whose daemon keeps it (omitted when none does).
	SnapshotAgeSeconds float64 `json:"snapshot_age_seconds,omitempty"`
	KeptBy             string  `json:"kept_by,omitempty"`
	// RetiredAt is when a Retired table was retired; omitted for others.
	RetiredAt *time.Time `json:"retired_at,omitempty"`
	// Note explains a status: why the stream stopped or broke.
	Note string `json:"note,omitempty"`
}

// GapReport is one gap: the LSN range [from, to), its size in bytes of WAL, and the key ranges it
// misses (nil: every key).
type GapReport struct {
	FromLSN LSN        `json:"from_lsn"`
	ToLSN   LSN        `json:"to_lsn"`
	Bytes   uint64     `json:"bytes"`
	Keys    []KeyRange `json:"keys"`
}

// KeyRange is the key range (Lower, Upper] of a backfill chunk, key column values in text form;
// a nil bound is unbounded. With Blocks, it is a block plan's chunk: the rows stored in blocks
// [Lower, Upper) of the source table when the chunk was read, one block number each.
type KeyRange struct {
	Lower  []string `json:"lower"`
	Upper  []string `json:"upper"`
	Blocks bool     `json:"blocks,omitempty"`
}

// Facts are what a report needs beyond the ledger: what the source says, and the backfill locks
// held on the target. The engine gathers them around ReadTables in this order, which keeps the
// report honest while a daemon streams: the slots are read before the ledger (a streaming daemon's
// confirmed_flush_lsn, read first, is then never above the progress read after it, unless someone
// else moved the slot), AfterLSN after it (a watermark moves while the report is made, never past
// the source).
type Facts struct {
	// SourceLSN is the source's current WAL position read before the ledger; AfterLSN one read
	// after it.
	SourceLSN, AfterLSN pglogrepl.LSN
	// SourceID identifies the source database the URL reaches (cdc.SourceID).
	SourceID string
	// Slots are the slots the report lists (OpenSlots, or the default slot when none is open);
	// MoreSlots those that streamed tables name beyond them (a segment opened after the slots
	// were read).
	Slots, MoreSlots []SlotHealth
	// Memberships are the current publication membership tokens of the streamed tables
	// (cdc.Memberships of each table's publication); a missing token is a changed membership.
	Memberships map[changebatch.TableName]string
	// SourceChanges says, per streamed table, why its source table may hold values the target's
	// rows lack with no change the stream will deliver (apply.ShapeChanges against its current
	// description): a rewrite, a column added, re-created or retyped.
	SourceChanges map[changebatch.TableName][]string
	// Held marks the tables whose backfill lock a session holds (BackfillHeld): a backfill of
	// them runs now.
	Held map[changebatch.TableName]bool
	// RowFilters are the row filters of the streamed tables' publications (cdc.ReadRowFilter);
	// a table without one is absent.
	RowFilters map[changebatch.TableName]string
	// ColumnLists are the listed columns of the streamed tables published with a column list.
	ColumnLists map[changebatch.TableName][]string
	// Waits are the recorded waits (ReadWaits) of the slots a daemon of which runs now.
	Waits []Wait
}

// NewReport returns the report of the tables' ledger states (ReadTables) given the facts. A slot
// that is lost or missing, or a table whose publication membership changed since the daemon
// recorded it, cannot deliver what follows its watermark: the range from there to the source's
// current position is reported as a gap at once, before the daemon notices. A table the source
// changed in a way no streamed change shows is schema-changed at once too. It returns an error
// wrapping ErrOtherSource when the source is not the database the ledger's streams read, or is
// behind a watermark (restored from a backup, failed over to a standby that lacks changes).
func NewReport(states map[changebatch.TableName]*TableState, f Facts) (Report, error) {
	rep := Report{SourceLSN: LSN(f.SourceLSN), Slots: slices.Clone(f.Slots), Waiting: append([]Wait{}, f.Waits...)}
	slices.SortFunc(rep.Slots, func(a, b SlotHealth) int { return strings.Compare(a.Name, b.Name) })
	slots := map[string]SlotHealth{}
	for _, h := range append(slices.Clone(f.MoreSlots), f.Slots...) {
		slots[h.Name] = h
	}
	if err := CheckStreamSource(states, f.SourceID, f.AfterLSN); err != nil {
		return rep, err
	}
	rep.Covered = true
	for _, st := range states {
		tr := tableReport(st, slots[st.Slot], f)
		if r := f.SourceChanges[st.Table]; len(r) > 0 && tr.Status != NotStreamed && tr.Status != SnapshotOnly {
			tr.Status = SchemaChanged
			tr.Note = strings.TrimPrefix(tr.Note+"; the source table changed since the stream last followed it, in a way no streamed change shows ("+
				strings.Join(r, "; ")+"): its rows are loaded again once the daemon notices (within 5 s)", "; ")
		}
		if tr.RowFilter = f.RowFilters[st.Table]; tr.RowFilter != "" && tr.Status != NotStreamed {
			tr.Note = strings.TrimPrefix(tr.Note+"; as filtered by the publication: only rows WHERE "+tr.RowFilter+
				" are replicated (a row updated out of the filter is deleted on the target)", "; ")
		}
		if tr.ColumnList = f.ColumnLists[st.Table]; tr.ColumnList != nil && tr.Status != NotStreamed {
			tr.Note = strings.TrimPrefix(tr.Note+"; as listed by the publication: only columns "+strings.Join(tr.ColumnList, ", ")+" are replicated", "; ")
		}
		if tr.Status.Failing() {
			rep.Covered = false
		}
		rep.Tables = append(rep.Tables, tr)
	}
	slices.SortFunc(rep.Tables, func(a, b TableReport) int { return strings.Compare(a.Table, b.Table) })
	return rep, nil
}

// CheckStreamSource returns an error wrapping ErrOtherSource when a streamed table of states is
// followed from another source database than sourceID (cdc.SourceID), or when the source's WAL
// position after, read after the ledger, is behind a table's watermark (the source was restored
// from a backup or failed over to a standby that lacks changes the target holds).
func CheckStreamSource(states map[changebatch.TableName]*TableState, sourceID string, after pglogrepl.LSN) error {
	for _, st := range states {
		if !st.Streaming {
			continue
		}
		if st.Source != "" && st.Source != sourceID {
			return fmt.Errorf("%w: the target's ledger follows %s from source database %s (system identifier/database), but the source URL reaches %s: pass the source URL the daemon replicates from",
				ErrOtherSource, st.Table, st.Source, sourceID)
		}
		if after < st.Ledger.Watermark {
			return fmt.Errorf("%w: the source's WAL position %s is behind %s's watermark %s: the source was restored from a backup or failed over to a standby that lacks changes the target holds; the target must be loaded again into a new database",
				ErrOtherSource, after, st.Table, st.Ledger.Watermark)
		}
	}
	return nil
}

// OpenSlots returns the slots with an open stream segment in the ledger, the slots a report
// describes.
func OpenSlots(ctx context.Context, db DB) ([]string, error) {
	rows, err := db.Query(ctx, `select distinct slot from pgconverge.stream_segments where end_lsn is null`)
	if err != nil {
		return nil, fmt.Errorf("read the ledger's slots: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the ledger's slots: %w", err)
	}
	return names, nil
}

// tableReport builds one table's report from its ledger, its slot's health and the facts.
func tableReport(st *TableState, slot SlotHealth, f Facts) TableReport {
	now := f.SourceLSN
	led := st.Ledger
	led.Spans = slices.Clone(led.Spans)
	tr := TableReport{Table: st.Table.String(), WatermarkLSN: LSN(led.Watermark), Gaps: []GapReport{}}
	if now > led.Watermark {
		tr.LagBytes = uint64(now - led.Watermark)
	}
	if st.Backfilled != 0 {
		b := LSN(st.Backfilled)
		tr.BackfillLSN = &b
	}
	if st.SnapshotOnly != "" && !st.Streaming {
		return snapshotOnlyReport(st, tr)
	}
	if !st.Streaming && st.Retired != nil {
		at := *st.Retired
		tr.Status, tr.RetiredAt = Retired, &at
		tr.Note = "retired (" + st.RetiredReason + "): no stream follows this table, on purpose; its target copy holds the source as of its watermark"
		return tr
	}
	if !st.Streaming {
		tr.Status, tr.Note = NotStreamed, "no stream follows this table any more"
		if st.LastEndReason != "" {
			tr.Note += " (its stream ended: " + st.LastEndReason + ")"
		}
		tr.Note += fmt.Sprintf(": its target copy stopped following the source at its watermark; select it again (pgconverge run --tables) to load and follow it, or, if that is meant, pgconverge retire --table %s", st.Table)
		return tr
	}
	start := LSN(st.StreamStart)
	tr.Slot, tr.StreamStartLSN = st.Slot, &start
	tr.Following, tr.WatermarkAgeSeconds = slot.Exists && slot.Active, st.WatermarkAge.Round(time.Second).Seconds()
	backfilled := st.Backfilled
	switch {
	case st.TargetReplaced:
		// Nothing recorded is in the target table now: no backfill, no span counts.
		led = gaps.Ledger{Watermark: led.Watermark}
		tr.BackfillLSN, tr.StreamStartLSN, backfilled = nil, nil, 0
		tr.Note = "the target table is missing or was replaced by hand since pgconverge registered it: pgconverge run recreates it if needed and loads it"
	case !slot.Exists || slot.Plugin != "pgoutput":
		tr.Note = fmt.Sprintf("slot %s is missing (or replaced by a slot of another kind): its stream cannot deliver what follows the watermark", slot.Name)
		led.Watermark = max(led.Watermark, now)
	case slot.Invalidated():
		tr.Note = fmt.Sprintf("slot %s is invalidated: its stream cannot deliver what follows the watermark", slot.Name)
		led.Watermark = max(led.Watermark, now)
	case slot.ConfirmedFlushLSN == nil:
		// A logical slot has no confirmed_flush_lsn only while it is being created: this one
		// replaces the slot whose stream followed the table (it was dropped or lost).
		tr.Note = fmt.Sprintf("slot %s is being created again (it has no confirmed_flush_lsn yet): the stream of the slot it replaces cannot deliver what follows the watermark", slot.Name)
		led.Watermark = max(led.Watermark, now)
	case slot.ConfirmedFlushLSN != nil && *slot.ConfirmedFlushLSN > LSN(led.Watermark):
		tr.Note = fmt.Sprintf("slot %s has confirmed_flush_lsn %s, past the watermark: another consumer advanced it, or it was dropped and created again, so its stream skips what lies between",
			slot.Name, *slot.ConfirmedFlushLSN)
		led.Watermark = pglogrepl.LSN(*slot.ConfirmedFlushLSN) // the stream resumes there
	case f.Memberships[st.Table] != st.Membership:
		tr.Note = "the table's publication membership changed since the daemon recorded it: its stream ended at the last confirmed position"
		last := &led.Spans[len(led.Spans)-1]
		last.To = max(last.From, min(last.To, st.Confirmed))
		led.Watermark = max(led.Watermark, now)
	}
	found := gaps.Find(led)
	for _, g := range found {
		tr.Gaps = append(tr.Gaps, GapReport{FromLSN: LSN(g.From), ToLSN: LSN(g.To), Bytes: g.Bytes(), Keys: keyRanges(led.Chunks, g.Chunks)})
	}
	tr.GapBytes = gaps.Total(found)
	switch {
	case len(found) == 0:
		tr.Status = Covered
	case f.Held[st.Table]:
		tr.Status = Loading
	case backfilled == 0 && st.SchemaChanged != 0:
		tr.Status = SchemaChanged
		tr.Note = strings.TrimPrefix(tr.Note+"; "+fmt.Sprintf("the source table changed in a way no streamed change shows (columns, or a rewrite; recorded at %s): backfills read until then no longer count", st.SchemaChanged), "; ")
	case backfilled == 0:
		tr.Status = NeverLoaded
	default:
		tr.Status = GapStatus
	}
	if slot.Exists && !slot.Active {
		tr.Note = strings.TrimPrefix(tr.Note+"; "+fmt.Sprintf("stopped: no daemon streams from slot %s now, and the stream last recorded its progress %s ago (the daemon is stopped, loading or reconnecting)",
			slot.Name, time.Duration(tr.WatermarkAgeSeconds)*time.Second), "; ")
	}
	return tr
}

// keyRanges returns the key ranges of the chunks at idx (in key order), adjacent chunks merged
// into one range; nil for nil (every key).
func keyRanges(chunks []gaps.Chunk, idx []int) []KeyRange {
	var out []KeyRange
	for k, i := range idx {
		if k > 0 && idx[k-1] == i-1 {
			out[len(out)-1].Upper = chunks[i].Upper
			continue
		}
		out = append(out, KeyRange{Lower: chunks[i].Lower, Upper: chunks[i].Upper, Blocks: chunks[i].Blocks})
	}
	return out
}

// CheckLedger returns an error naming the fix when tgt holds no coverage ledger.
func CheckLedger(ctx context.Context, tgt *pgx.Conn) error {
	var ok bool
	if err := tgt.QueryRow(ctx, `select to_regclass('pgconverge.stream_segments') is not null`).Scan(&ok); err != nil {
		return fmt.Errorf("look up the coverage ledger: %w", err)
	}
	if !ok {
		return fmt.Errorf("the target database %q has no pgconverge coverage ledger (schema pgconverge, version 3 or later): run pgconverge run against it first", tgt.Config().Database)
	}
	return nil
}

// DescribeKeys returns the key ranges of the chunks at idx, adjacent ones merged, for logs:
// "(lower, upper]" each, -inf and +inf for unbounded ends.
func DescribeKeys(chunks []gaps.Chunk, idx []int) string {
	return FormatKeyRanges(keyRanges(chunks, idx))
}

// FormatKeyRanges prints key ranges as "(lower, upper]" each, -inf and +inf for unbounded ends,
// a composite key's values in parentheses; a value that is empty or holds a comma, a parenthesis,
// a bracket, a space or a quote is quoted (strconv.Quote). A block plan's range is printed
// "blocks [lower, upper)".
func FormatKeyRanges(ranges []KeyRange) string {
	bound := func(k []string, inf string) string {
		if k == nil {
			return inf
		}
		vals := make([]string, len(k))
		for i, v := range k {
			vals[i] = v
			if v == "" || strings.ContainsAny(v, ",()[] \"\\") {
				vals[i] = strconv.Quote(v)
			}
		}
		if len(vals) == 1 {
			return vals[0]
		}
		return "(" + strings.Join(vals, ",") + ")"
	}
	parts := make([]string, len(ranges))
	for i, r := range ranges {
		parts[i] = "(" + bound(r.Lower, "-inf") + ", " + bound(r.Upper, "+inf") + "]"
		if r.Blocks {
			parts[i] = "blocks [" + bound(r.Lower, "0") + ", " + bound(r.Upper, "+inf") + ")"
		}
	}
	return strings.Join(parts, " ")
}

// snapshotOnlyReport completes tr for a table kept by snapshots only: snapshot-only as of its last
// backfill, or never-loaded (a gap) until one completed.
func snapshotOnlyReport(st *TableState, tr TableReport) TableReport {
	tr.WatermarkLSN, tr.LagBytes, tr.KeptBy = 0, 0, st.KeptBy
	if st.Backfilled == 0 || st.TargetReplaced {
		tr.Status, tr.BackfillLSN = NeverLoaded, nil
		tr.Note = "snapshot-only (" + st.SnapshotOnly + "): no backfill of it completed yet"
		return tr
	}
	tr.Status = SnapshotOnly
	tr.SnapshotAgeSeconds = st.LoadedAge.Round(time.Second).Seconds()
	tr.Note = fmt.Sprintf("snapshot-only (%s): the target holds it as of snapshot %s, taken %s ago; backfills keep it (run --snapshot-schedule, or pgconverge backfill)",
		st.SnapshotOnly, st.Backfilled, st.LoadedAge.Round(time.Second))
	if st.KeptBy != "" {
		tr.Note += "; kept by the daemon of slot " + st.KeptBy
	}
	return tr
}

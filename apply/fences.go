package apply

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Progress is a stream's position to record with a transaction: every change of the source up to
// LSN is in the target once it commits. The zero value records nothing.
type Progress struct {
	Slot string
	LSN  pglogrepl.LSN
	// Epoch, when not 0, is the leader epoch of Slot the writer holds (Lead): the transaction
	// checks it as CheckLeaderTx does and fails with a *FencedError when another leader took over.
	Epoch int64
}

// queueStart queues in b what a stream transaction does before it merges: it locks the fence
// rows of tabs not locked yet (as lockFence would, table by table) and records p when p.Slot is
// set (SetProgressTx), after checking p.Epoch when set (CheckLeaderTx). It returns the function that reads those results from the batch's
// results, in order, before any later statement's, and checks that every table is registered
// in pgconverge.tables.
func (t *Tx) queueStart(b *pgx.Batch, tabs []changebatch.Table, p Progress) func(pgx.BatchResults) error {
	var share, update [2][]string // schemas, names
	for _, tab := range tabs {
		if _, ok := t.fences[tab.String()]; ok {
			continue
		}
		l := &share
		if tab.Keyless {
			l = &update
		}
		l[0], l[1] = append(l[0], tab.Schema), append(l[1], tab.Name)
	}
	locks := 0
	for i, l := range [][2][]string{share, update} {
		if len(l[0]) == 0 {
			continue
		}
		lock := "share"
		if i == 1 {
			lock = "update"
		}
		b.Queue(`select schema_name, table_name, fence_lsn::text, fence_seq from pgconverge.tables
where (schema_name, table_name) in (select * from unnest($1::text[], $2::text[])) for `+lock, l[0], l[1])
		locks++
	}
	if p.Slot != "" && p.Epoch != 0 {
		b.Queue(leaderSQL, p.Slot)
	}
	if p.Slot != "" {
		b.Queue(progressSQL, p.Slot, p.LSN.String())
	}
	return func(br pgx.BatchResults) error {
		for range locks {
			if err := t.readFences(br); err != nil {
				return fmt.Errorf("lock the fences of %d tables: %w", len(tabs), err)
			}
		}
		if p.Slot != "" && p.Epoch != 0 {
			if err := checkLeader(br.QueryRow(), p.Slot, p.Epoch); err != nil {
				return err
			}
		}
		if p.Slot != "" {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("record progress %s of slot %q: %w", p.LSN, p.Slot, err)
			}
		}
		for _, tab := range tabs {
			if _, ok := t.fences[tab.String()]; !ok {
				return errNotRegistered(tab)
			}
		}
		return nil
	}
}

// readFences reads one fence lock query's rows (queueStart) into t.fences.
func (t *Tx) readFences(br pgx.BatchResults) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var schema, name, lsn string
		var seq int64
		if err := rows.Scan(&schema, &name, &lsn, &seq); err != nil {
			return err
		}
		l, err := pglogrepl.ParseLSN(lsn)
		if err != nil {
			return err
		}
		t.fences[changebatch.TableName{Schema: schema, Name: name}.String()] = changebatch.Version{LSN: l, Seq: uint64(seq)}
	}
	return rows.Err()
}

func errNotRegistered(tab changebatch.Table) error {
	return fmt.Errorf("table %s is not registered in pgconverge.tables on the target (apply.EnsureTable registers it)", tab)
}

// lockFence returns tab's fence, locking its row in pgconverge.tables until the transaction ends:
// FOR SHARE, or FOR UPDATE for a keyless table. A fence already locked (queueStart) is returned
// without a round trip.
func (t *Tx) lockFence(ctx context.Context, tab changebatch.Table) (changebatch.Version, error) {
	key := tab.String()
	if f, ok := t.fences[key]; ok {
		return f, nil
	}
	var lsn string
	var seq int64
	// Writers of a keyless table take turns: each matches deletes with the entries it finds.
	lock := "share"
	if tab.Keyless {
		lock = "update"
	}
	err := t.tx.QueryRow(ctx, `select fence_lsn::text, fence_seq from pgconverge.tables
where schema_name = $1 and table_name = $2 for `+lock, tab.Schema, tab.Name).Scan(&lsn, &seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return changebatch.Version{}, errNotRegistered(tab)
	}
	if err != nil {
		return changebatch.Version{}, fmt.Errorf("lock the fence of %s: %w", tab, err)
	}
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return changebatch.Version{}, fmt.Errorf("lock the fence of %s: %w", tab, err)
	}
	f := changebatch.Version{LSN: l, Seq: uint64(seq)}
	t.fences[key] = f
	return f, nil
}

// progressSQL records slot $1's progress at $2 (pg_lsn text); it never lowers the stored position.
const progressSQL = `insert into pgconverge.progress as p (slot, applied_lsn) values ($1, $2::pg_lsn)
on conflict (slot) do update set applied_lsn = excluded.applied_lsn, updated_at = now()
where p.applied_lsn <= excluded.applied_lsn`

// SetProgressTx records, in a transaction of the caller's, that the target holds every change of
// the source up to lsn for slot. It never lowers the stored position.
func SetProgressTx(ctx context.Context, tx pgx.Tx, slot string, lsn pglogrepl.LSN) error {
	if _, err := tx.Exec(ctx, progressSQL, slot, lsn.String()); err != nil {
		return fmt.Errorf("record progress %s of slot %q: %w", lsn, slot, err)
	}
	return nil
}

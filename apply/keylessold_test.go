package apply

// TEMPORARY: the statements keyless.go builds inline today, copied verbatim from its bodies, to
// capture the golden files before they become named builders.

import "github.com/pgconverge/pgconverge/apply/changebatch"

func keylessCopySQL(tab changebatch.Table, q string) string {
	v := struct{ Table changebatch.Table }{tab}
	return "copy " + q + " (" + dataColumns(v.Table, "") + ", " + qLSN + ", " + qSeq + ", " + qDeleted + ", " + qOccurrence + ", " + qOrd + ") from stdin"
}

func keylessHashSQL(tab changebatch.Table, q string) string {
	v := struct{ Table changebatch.Table }{tab}
	return "update " + q + " as s set " + qRowHash + " = " + RowHashSQL(v.Table, "s")
}

func keylessInsertSQL(tab changebatch.Table, stage string) string {
	cols := dataColumns(tab, "")
	return "insert into " + tab.Quoted() + " (" + cols + ", " + qRowHash + ", " + qOccurrence + ", " + qLSN + ", " + qSeq + ")\n" +
		"select " + dataColumns(tab, "s") + ", s." + qRowHash + ", 1, s." + qLSN + ", s." + qSeq + " from " + stage + " as s\n" +
		"where not s." + qDeleted + " and not " + keylessReplay(tab) + "\n" +
		"on conflict do nothing"
}

func keylessRoundsSQL(stage string) string {
	return "with r as (select ctid as id, row_number() over (partition by " + qRowHash + " order by " + qOrd + ") as n from " + stage +
		" where " + qDeleted + "), u as (update " + stage + " as s set " + qRound + " = r.n from r where s.ctid = r.id returning s." + qRound + ")" +
		" select coalesce(max(" + qRound + "), 0) from u"
}

func keylessSkipNewerSQL(tab changebatch.Table, stage string) string {
	q := tab.Quoted()
	return "delete from " + stage + " as s where exists (select 1 from " + q + " as e where e." + qRowHash + " = s." + qRowHash +
		" and e." + qSeq + " = 0 and (e." + qLSN + ", e." + qSeq + ") > ($1::pg_lsn, 0))"
}

func keylessSupersedeStagedSQL(tab changebatch.Table, stage string) string {
	return supersedeSQL(tab, "e."+qRowHash+" in (select "+qRowHash+" from "+stage+")")
}

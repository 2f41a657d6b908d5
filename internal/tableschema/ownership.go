package tableschema

import "fmt"

// ownership compares the owners and the grants of other roles.
func (c *comparison) ownership(src, tgt Schema) {
	if src.Owner != tgt.Owner {
		c.add(Difference{Kind: KindOwner, Source: src.Owner, Target: tgt.Owner, phase: phaseOwnership,
			Fix: []string{c.alter("owner to %s", q(src.Owner))}})
	}
	grantee := func(g Grant) string {
		if g.Grantee == "PUBLIC" {
			return "public"
		}
		return q(g.Grantee)
	}
	on := " on table " + c.t.Quoted() + " "
	key := func(g Grant) [2]string { return [2]string{g.Grantee, g.Privilege} }
	pair(src.Grants, tgt.Grants, key, func(g, t Grant, found bool) {
		if found && t.Grantable == g.Grantable {
			return
		}
		fix := "grant " + g.Privilege + on + "to " + grantee(g)
		if g.Grantable {
			fix += " with grant option"
		}
		d := Difference{Kind: KindGrant, Object: g.Grantee + " " + g.Privilege, Source: fmt.Sprint("granted, grant option ", g.Grantable),
			phase: phaseOwnership, Fix: []string{fix}}
		if found {
			d.Target = fmt.Sprint("granted, grant option ", t.Grantable)
		}
		c.add(d)
	}, func(t Grant) {
		c.add(Difference{Kind: KindGrant, Object: t.Grantee + " " + t.Privilege, Target: "granted", TargetOnly: true, phase: phaseOwnership,
			Fix: []string{"revoke " + t.Privilege + on + "from " + grantee(t)}})
	})
}

package cdc

import (
	"fmt"
	"regexp"
)

// slotName follows PostgreSQL's rule for replication slot names (ReplicationSlotValidateName):
// lower-case letters, digits and underscores, at most 63 bytes.
var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// publicationName accepts names that need no quoting, so they can be written as a literal in
// START_REPLICATION's publication_names option, which takes no parameters.
var publicationName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSlotName returns an error naming the rule when name is not a valid slot name.
func ValidateSlotName(name string) error {
	if !slotName.MatchString(name) {
		return fmt.Errorf("slot name %q is invalid: use 1 to 63 lower-case letters, digits or underscores", name)
	}
	return nil
}

// ValidatePublicationName returns an error naming the rule when name is not a publication name
// pgconverge accepts.
func ValidatePublicationName(name string) error {
	if !publicationName.MatchString(name) {
		return fmt.Errorf("publication name %q is invalid: use a lower-case letter or underscore, then up to 62 lower-case letters, digits or underscores", name)
	}
	return nil
}

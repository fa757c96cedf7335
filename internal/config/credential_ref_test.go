package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCredentialRefRendersTheSecretIntoItsFormat(t *testing.T) {
	for _, tc := range []struct {
		ref  CredentialRef
		want string
	}{
		{CredentialRef{Header: "Authorization"}, "Bearer sk-1"},
		{CredentialRef{Header: "X-Api-Key"}, "sk-1"},
		{CredentialRef{Header: "X-Api-Key", Format: "Token {value}; v=2"}, "Token sk-1; v=2"},
		{CredentialRef{Header: "X-Api-Key", Format: "{value}{value}"}, "sk-1{value}"},
	} {
		tc.ref.applyDefaults()
		assert.Equal(t, tc.want, tc.ref.Render("sk-1"), "%+v", tc.ref)
	}
}

package policy_test

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/sandgate/sandgate/policy"
)

// pushBundle pushes a bundle to repo:tag the way `oras push REPO:TAG
// bundle.tar.gz:application/vnd.oci.image.layer.v1.tar+gzip` does and OPA's OCI downloader
// expects: an OCI image manifest with the bundle as its one tar+gzip layer.
func pushBundle(t *testing.T, repo, tag string, tarball []byte) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	layer, err := oras.PushBytes(ctx, store, ocispec.MediaTypeImageLayerGzip, tarball)
	require.NoError(t, err)
	manifest, err := oras.PackManifest(ctx, store, oras.PackManifestVersion1_0, ocispec.MediaTypeImageConfig,
		oras.PackManifestOptions{Layers: []ocispec.Descriptor{layer}})
	require.NoError(t, err)
	require.NoError(t, store.Tag(ctx, manifest, tag))
	target, err := remote.NewRepository(repo)
	require.NoError(t, err)
	target.PlainHTTP = true
	_, err = oras.Copy(ctx, store, tag, target, tag, oras.DefaultCopyOptions)
	require.NoError(t, err)
}

// A real registry (go-containerregistry's registry:2 implementation) on loopback, spoken to
// over HTTP by OPA's own OCI downloader.
func TestBundleFromOCIRegistryIsPulledVerifiedAndFollowed(t *testing.T) {
	ctx := t.Context()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	repo := host + "/acme/sandgate-policy"
	ref := repo + ":prod"
	key := newSigningKey(t)

	pushBundle(t, repo, "prod", buildBundle(t, "oci-v1", allowTool("echo"), &key))
	var seen reloads
	e, src, err := policy.NewBundleEngine(ctx, policy.BundleConfig{OCI: ref, OCIPlainHTTP: true, OCIStore: t.TempDir(),
		PublicKey: key.public, Algorithm: "ES256"}, policy.WithReloadObserver(seen.observe))
	require.NoError(t, err)
	assert.Equal(t, "oci-v1", e.Revision())
	d := e.Decide(ctx, callTool("echo"))
	assert.True(t, d.Allow)
	assert.Equal(t, "oci-v1", d.Revision)

	require.NoError(t, src.Poll(ctx))
	assert.False(t, seen.last().Changed, "the same digest is not installed again")

	pushBundle(t, repo, "prod", buildBundle(t, "oci-v2", allowTool("search"), &key))
	require.NoError(t, src.Poll(ctx))
	assert.Equal(t, "oci-v2", e.Revision())
	assert.True(t, e.Decide(ctx, callTool("search")).Allow)

	pushBundle(t, repo, "prod", buildBundle(t, "oci-v3", allowTool("delete_repo"), nil))
	require.Error(t, src.Poll(ctx))
	assert.Equal(t, "oci-v2", e.Revision(), "an unsigned image is refused; the last good keeps serving")
	assert.Equal(t, policy.ReloadSignature, seen.last().Reason)
	assert.True(t, e.Status().Degraded())
}

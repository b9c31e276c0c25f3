// Package certgen makes a throwaway certificate authority and the leaf
// certificates of a local questrt cluster (questctl up): one per node and
// one for the client, each usable for both server and client
// authentication (mutual TLS), with the standard library only
// (crypto/x509).
//
// Every key is ECDSA P-256. Certificates are valid for [Validity] (7
// days) from five minutes before they are made (a little clock skew
// between processes is tolerated): long enough for a development
// cluster, short enough that a copied key is worth little for long. The
// CA may sign leaves only (path length 0). A leaf's subject alternative
// names are always 127.0.0.1, ::1 and localhost, plus the IP addresses
// and DNS names given.
//
// For questctl up the CA's private key stays in memory: [WriteFiles]
// writes the CA certificate (ca.pem, mode 0644) and each leaf as
// NAME.pem (0644) and NAME.key (0600, PKCS #8), so nothing written can
// sign new certificates. Files are replaced atomically (written under a
// temporary name, then renamed), so a key file never has a wider mode
// than 0600, even when it replaces an older file.
//
// For an operator's CA (questctl tls) the key is kept: [WriteCA] writes
// ca.pem and ca.key (0600), [LoadCA] reads them back to issue more
// leaves, and [WriteLeaf] writes one leaf; both refuse to replace an
// existing file ([ErrExists]) unless forced. [NewCAFor] and
// [CA.LeafValidity] set validities other than [Validity].
//
// A deployment with a PKI of its own (cert-manager, a corporate CA)
// needs none of this (its node certificates need the role URI SANs);
// questd rotates certificates with its SIGHUP reload.
package certgen

module tlsterm.test/goclient

go 1.25

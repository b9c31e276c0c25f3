module github.com/questrt/questrt

go 1.26

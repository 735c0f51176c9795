"""The serving images, one folder each; `images.common` is the HTTP layer the servers and the local router share."""
